"""The wire: the Transport interface and the ring All-Reduce over it (`base`), frames and their
schema, the mailbox rules for incoming messages, the ZeroMQ data plane and its sockets, the
control plane, authentication, and injected faults."""

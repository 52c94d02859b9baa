//! The testbed cluster: fabric network, worker container with sshd.

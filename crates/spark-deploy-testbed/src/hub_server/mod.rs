//! HF-compatible hub server.

//! The Hub port: resolve, download, verify.

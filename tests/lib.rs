//! Test support lives in the integration binary.

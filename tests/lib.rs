//! timeoutd's integration tests live in `integration/`; see `README.md` here.

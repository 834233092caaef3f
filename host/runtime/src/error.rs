//! Errors at the plugin boundary, each tagged with the plugin it came from.

use crate::model::PolicyError;

/// Why a plugin could not be loaded. The daemon refuses the plugin and keeps what it had.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("plugin `{plugin}`: cannot read {path}: {source}")]
    Read {
        /// Plugin name.
        plugin: String,
        /// Path that was read.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The bytes are not a WebAssembly component (a core module, or not wasm at all).
    #[error(
        "plugin `{plugin}`: not a WebAssembly component ({detail}); build it for wasm32-wasip2"
    )]
    NotAComponent {
        /// Plugin name.
        plugin: String,
        /// What the bytes looked like.
        detail: String,
    },
    /// The bytes start like wasm but cannot be parsed (truncated or corrupt), or carry an
    /// unreadable API-version stamp. Found before compiling.
    #[error("plugin `{plugin}`: malformed WebAssembly at byte {offset}: {reason}")]
    Malformed {
        /// Plugin name.
        plugin: String,
        /// Byte offset of the problem in the file.
        offset: usize,
        /// The parser's message.
        reason: String,
    },
    /// The component was built against a `timeout:policy` version this host does not run: read
    /// from the SDK's stamp before compiling, or else from its imports after.
    #[error(
        "plugin `{plugin}`: built against timeout:policy@{found}, but this host supports {supported}"
    )]
    UnsupportedVersion {
        /// Plugin name.
        plugin: String,
        /// Version the component says it was built against.
        found: String,
        /// Supported versions, comma-separated.
        supported: String,
    },
    /// The plugin's limits cannot be honoured by this engine.
    #[error("plugin `{plugin}`: {reason}")]
    Limits {
        /// Plugin name.
        plugin: String,
        /// Which limit, and the engine's ceiling.
        reason: String,
    },
    /// Compilation or linking failed (bad wasm, missing exports, imports the host does not give).
    #[error("plugin `{plugin}`: {stage} failed: {reason}")]
    Compile {
        /// Plugin name.
        plugin: String,
        /// `compile`, `link` or `cache`.
        stage: &'static str,
        /// The engine's message.
        reason: String,
    },
}

/// Which limit or fault ended a call in a trap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrapKind {
    /// The epoch deadline passed (the plugin ran too long).
    Deadline,
    /// The plugin tried to grow memory past its cap.
    Memory,
    /// Any other trap: a panic, `unreachable`, an out-of-bounds access.
    Fault,
}

impl TrapKind {
    /// `deadline`, `memory` or `fault`.
    pub fn as_str(self) -> &'static str {
        match self {
            TrapKind::Deadline => "deadline",
            TrapKind::Memory => "memory",
            TrapKind::Fault => "fault",
        }
    }
}

/// Why a `decide` or `check` call produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The plugin returned its own domain error (`policy-error`).
    #[error("plugin `{plugin}` refused to decide: {error}")]
    Policy {
        /// Plugin name.
        plugin: String,
        /// The guest's error.
        error: PolicyError,
    },
    /// The call trapped; its `Store` was discarded.
    #[error("plugin `{plugin}` trapped ({}): {message}", kind.as_str())]
    Trap {
        /// Plugin name.
        plugin: String,
        /// Which limit or fault.
        kind: TrapKind,
        /// The engine's message, with the guest's backtrace if any.
        message: String,
    },
    /// The answer broke a host limit (too many effects, oversized strings).
    #[error("plugin `{plugin}` returned an oversized answer: {reason}")]
    Oversized {
        /// Plugin name.
        plugin: String,
        /// Which limit.
        reason: String,
    },
    /// The host could not run the call (instance pool exhausted and the like).
    #[error("plugin `{plugin}` could not be instantiated: {reason}")]
    Host {
        /// Plugin name.
        plugin: String,
        /// The engine's message.
        reason: String,
    },
}

impl DecideError {
    /// True when calling again may succeed (a host-side problem or a deadline hit under load);
    /// false when the same input will fail the same way.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            DecideError::Host { .. }
                | DecideError::Trap {
                    kind: TrapKind::Deadline,
                    ..
                }
        )
    }
}

//! Loading plugins: bytes or a file, under the engine's default limits or a merchant's own, into
//! a [`Plugin`] (version check, compile or cache hit, link).

use std::path::Path;

use crate::engine::{PluginLimits, PolicyEngine};
use crate::error::LoadError;
use crate::plugin::Plugin;

impl PolicyEngine {
    /// Loads a plugin from bytes under the engine's default limits: version check, compile (or
    /// cache hit), link.
    ///
    /// # Errors
    /// [`LoadError`] naming the plugin and what was wrong.
    pub fn load(&self, name: &str, bytes: &[u8]) -> Result<Plugin, LoadError> {
        Plugin::load(self.clone(), name, bytes, self.default_plugin_limits())
    }

    /// Loads a plugin whose calls run under `limits` instead of the engine's defaults.
    ///
    /// # Errors
    /// As [`PolicyEngine::load`]; [`LoadError::Limits`] when `limits.max_memory_bytes` exceeds
    /// [`crate::RuntimeLimits::max_plugin_memory_bytes`].
    pub fn load_with(
        &self,
        name: &str,
        bytes: &[u8],
        limits: PluginLimits,
    ) -> Result<Plugin, LoadError> {
        let ceiling = self.plugin_memory_ceiling();
        if limits.max_memory_bytes > ceiling {
            return Err(LoadError::Limits {
                plugin: name.to_string(),
                reason: format!(
                    "memory cap {} MiB exceeds the engine's max_plugin_memory_bytes ({} MiB)",
                    limits.max_memory_bytes >> 20,
                    ceiling >> 20
                ),
            });
        }
        Plugin::load(self.clone(), name, bytes, limits)
    }

    /// Loads a plugin from a file.
    ///
    /// # Errors
    /// [`LoadError::Read`] when the file cannot be read, else as [`PolicyEngine::load`].
    pub fn load_file(&self, name: &str, path: &Path) -> Result<Plugin, LoadError> {
        self.load_file_with(name, path, self.default_plugin_limits())
    }

    /// Loads a plugin from a file under `limits`.
    ///
    /// # Errors
    /// [`LoadError::Read`] when the file cannot be read, else as [`PolicyEngine::load_with`].
    pub fn load_file_with(
        &self,
        name: &str,
        path: &Path,
        limits: PluginLimits,
    ) -> Result<Plugin, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            plugin: name.to_string(),
            path: path.display().to_string(),
            source,
        })?;
        self.load_with(name, &bytes, limits)
    }
}

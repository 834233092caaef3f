//! Merchants' policy plugins: loading them from the config and finding the one for an order.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use timeoutd_runtime::{LoadError, Plugin, PolicyEngine, RuntimeLimits};

use crate::config::{Config, PluginSource};

/// The example plugins compiled into the binary by `build.rs` (`builtin:<name>` in the config).
pub fn builtin(name: &str) -> Option<&'static [u8]> {
    match name {
        "single-phase" => Some(include_bytes!(concat!(
            env!("OUT_DIR"),
            "/single_phase.wasm"
        ))),
        "two-phase" => Some(include_bytes!(concat!(env!("OUT_DIR"), "/two_phase.wasm"))),
        _ => None,
    }
}

/// A merchant's plugin and the settings it is called with.
#[derive(Debug)]
pub struct MerchantPolicy {
    /// Merchant id.
    pub merchant: String,
    /// The loaded plugin.
    pub plugin: Plugin,
    /// Settings from `[merchants.<id>.settings]`, in key order.
    pub settings: Vec<(String, String)>,
}

/// Every merchant's policy, by merchant id.
#[derive(Debug, Default)]
pub struct Policies {
    by_merchant: RwLock<HashMap<String, Arc<MerchantPolicy>>>,
}

/// The engine limits a config asks for.
pub fn limits(config: &Config) -> RuntimeLimits {
    RuntimeLimits {
        deadline: config.runtime.deadline,
        max_memory_bytes: config.runtime.max_memory_mib as usize * (1 << 20),
        ..RuntimeLimits::default()
    }
}

impl Policies {
    /// Loads every merchant's plugin. A plugin used by several merchants is compiled once.
    ///
    /// # Errors
    /// Every plugin that failed, each naming its merchant and why.
    pub fn load(config: &Config, engine: &PolicyEngine) -> Result<Policies, Vec<String>> {
        let mut loaded: HashMap<PluginSource, Plugin> = HashMap::new();
        let mut map = HashMap::new();
        let mut problems = Vec::new();
        for (id, merchant) in &config.merchants {
            let source = config.plugin_source(merchant);
            let plugin = match loaded.get(&source) {
                Some(p) => Ok(p.clone()),
                None => load_source(engine, &merchant.plugin, &source),
            };
            match plugin {
                Ok(plugin) => {
                    loaded.insert(source, plugin.clone());
                    map.insert(
                        id.clone(),
                        Arc::new(MerchantPolicy {
                            merchant: id.clone(),
                            plugin,
                            settings: merchant
                                .settings
                                .iter()
                                .map(|(k, v)| (k.clone(), v.clone()))
                                .collect(),
                        }),
                    );
                }
                Err(e) => problems.push(format!("merchants.{id}.plugin: {e}")),
            }
        }
        if problems.is_empty() {
            Ok(Policies {
                by_merchant: RwLock::new(map),
            })
        } else {
            Err(problems)
        }
    }

    /// The policy for `merchant`, if configured.
    pub fn get(&self, merchant: &str) -> Option<Arc<MerchantPolicy>> {
        self.by_merchant
            .read()
            .expect("policy map lock poisoned")
            .get(merchant)
            .cloned()
    }

    /// Every configured merchant's policy, by merchant id.
    pub fn all(&self) -> Vec<Arc<MerchantPolicy>> {
        let mut all: Vec<_> = self
            .by_merchant
            .read()
            .expect("policy map lock poisoned")
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.merchant.cmp(&b.merchant));
        all
    }
}

fn load_source(
    engine: &PolicyEngine,
    name: &str,
    source: &PluginSource,
) -> Result<Plugin, LoadError> {
    match source {
        PluginSource::Builtin(builtin_name) => {
            let bytes = builtin(builtin_name).ok_or_else(|| LoadError::NotAComponent {
                plugin: name.to_string(),
                detail: format!("no built-in plugin named `{builtin_name}`"),
            })?;
            engine.load(name, bytes)
        }
        PluginSource::File(path) => engine.load_file(name, path),
    }
}

//! Merchants' policy plugins: loading them from the config, finding the one for an order,
//! reloading them without a restart, and tripping the ones that keep failing.
//!
//! A reload validates and compiles each changed plugin before it replaces the old one; a plugin
//! that does not load is refused with its reason and the old one keeps serving. Decisions in
//! flight hold their own `Arc<MerchantPolicy>` and finish on the version they started with; the
//! decision log records the digest each one used.

mod breaker;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use serde::Serialize;
use timeoutd_runtime::{LoadError, Plugin, PluginLimits, PolicyEngine, RuntimeLimits};

pub use breaker::{Breaker, BreakerState};

use crate::config::{Config, MerchantConfig, OnPluginError, PluginSource};

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
    /// Trips after consecutive failures (shared across reloads of this merchant's plugin).
    pub breaker: Arc<Breaker>,
    /// What a plugin failure leads to (`merchants.<id>.on_plugin_error`).
    pub on_plugin_error: OnPluginError,
    /// Effect kinds the plugin may ask for (`merchants.<id>.granted_effects`); `None` = all.
    pub granted_effects: Option<Vec<String>>,
}

/// A merchant's shadow (`[merchants.<id>.shadow]`, [`crate::shadow`]): the candidate plugin
/// asked beside the live one, which never acts. Loaded with the merchant's limits when the
/// daemon starts, and again by a reload that finds its file changed.
#[derive(Debug)]
pub struct ShadowPolicy {
    /// Merchant id.
    pub merchant: String,
    /// The candidate plugin.
    pub plugin: Plugin,
    /// Its settings (`shadow.settings`, or the live plugin's when left out), in key order.
    pub settings: Vec<(String, String)>,
    /// The merchant's `granted_effects`: the guard reviews the shadow's answers as it would
    /// the live plugin's.
    pub granted_effects: Option<Vec<String>>,
    /// The share of triggers it is asked on, (0, 1].
    pub sample: f64,
}

/// A merchant's shadow as the daemon holds it.
#[derive(Debug, Clone)]
enum Shadow {
    /// Loaded: asked beside the live plugin.
    Asked(Arc<ShadowPolicy>, Source),
    /// Its file did not load: not asked; a reload that finds a good file takes it.
    Waiting(ShadowPolicyParts, Source),
}

/// What a shadow is asked with besides its plugin.
#[derive(Debug, Clone)]
struct ShadowPolicyParts {
    settings: Vec<(String, String)>,
    granted_effects: Option<Vec<String>>,
    sample: f64,
}

/// Where a merchant's plugin comes from, and the file's stamp when it was last loaded.
#[derive(Debug, Clone)]
struct Source {
    name: String,
    source: PluginSource,
    limits: PluginLimits,
    stamp: Option<(SystemTime, u64)>,
}

/// What a reload did for one merchant.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Reloaded {
    /// Merchant.
    pub merchant: String,
    /// The digest now serving.
    pub digest: String,
    /// Whether a new version replaced the old one.
    pub changed: bool,
    /// Why a new version was refused (the old one keeps serving).
    pub refused: Option<String>,
    /// Whether this is the merchant's shadow plugin (`[merchants.<id>.shadow]`), not its live one.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
}

/// A merchant whose plugin did not load when the daemon started ([`load_serving`]): its
/// triggers are held, neither decided nor dead-lettered, until a reload takes a good file; what
/// the merchant's policy needs besides the plugin is kept for then.
#[derive(Debug, Clone)]
struct Held {
    /// Why the plugin did not load (the last attempt's error).
    reason: String,
    settings: Vec<(String, String)>,
    on_plugin_error: OnPluginError,
    granted_effects: Option<Vec<String>>,
    breaker: Arc<Breaker>,
}

/// Every merchant's policy, by merchant id.
pub struct Policies {
    engine: PolicyEngine,
    by_merchant: RwLock<HashMap<String, Arc<MerchantPolicy>>>,
    sources: RwLock<HashMap<String, Source>>,
    /// Merchants whose plugin has not loaded yet, by merchant id.
    held: RwLock<HashMap<String, Held>>,
    /// Each merchant's shadow, loaded or waiting for a good file, and where its file is.
    shadows: RwLock<HashMap<String, Shadow>>,
}

impl std::fmt::Debug for Policies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policies")
            .field("merchants", &self.all().len())
            .finish()
    }
}

/// Why the merchants' policies could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The wasmtime engine could not be built.
    #[error("plugin engine: {0}")]
    Engine(String),
    /// One or more plugins could not be loaded, each named with its merchant and reason.
    #[error("plugins refused:\n  - {}", .0.join("\n  - "))]
    Plugins(Vec<String>),
}

/// Builds the engine and loads every merchant's plugin (no database needed): what `validate`
/// checks offline, and what `arm` does first.
///
/// # Errors
/// [`SetupError::Engine`] or [`SetupError::Plugins`].
pub fn load(config: &Config) -> Result<Arc<Policies>, SetupError> {
    let engine = PolicyEngine::new(limits(config), config.runtime.cache_dir.as_deref())
        .map_err(SetupError::Engine)?;
    Policies::load(config, &engine)
        .map(Arc::new)
        .map_err(SetupError::Plugins)
}

/// What a daemon loads when it starts (`run`): as [`load`], except that a merchant whose
/// plugin does not load does not stop the others (#46: one merchant's broken file must not
/// stop every merchant's closes). Its triggers are held — not decided, not dead-lettered —
/// and looked at again every `runtime.trip_for`, its name is in [`Policies::tripped`] (the
/// tripped-plugin alert), and the next reload that finds a good file (the watcher, or
/// `POST /v1/plugins/reload`) takes it. Returns the policies and one problem per held
/// merchant, for the log.
///
/// # Errors
/// [`SetupError::Engine`], or [`SetupError::Plugins`] when no merchant's plugin loads at all
/// (a daemon that can decide nothing is a bad config, not one merchant's trouble).
pub fn load_serving(config: &Config) -> Result<(Arc<Policies>, Vec<String>), SetupError> {
    let engine = PolicyEngine::new(limits(config), config.runtime.cache_dir.as_deref())
        .map_err(SetupError::Engine)?;
    let (policies, problems, shadow_problems) = Policies::load_all(config, &engine);
    if !problems.is_empty() && policies.all().is_empty() {
        return Err(SetupError::Plugins(problems));
    }
    for problem in &shadow_problems {
        tracing::error!(
            problem = %problem,
            "a merchant's shadow plugin did not load: that merchant runs without its shadow"
        );
    }
    for problem in &problems {
        tracing::error!(
            problem = %problem,
            "a merchant's plugin did not load: its triggers are held until a good file is \
             reloaded; the other merchants are served"
        );
    }
    Ok((Arc::new(policies), problems))
}

/// Reloads `policies` every `runtime.watch_plugins` until `shutdown` turns true (returns at
/// once when that is 0, off): a changed plugin file is taken when it loads, refused (the old
/// version serving on) when not.
pub fn watch(
    policies: Arc<Policies>,
    config: &Config,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let every = config.runtime.watch_plugins;
    async move {
        if every.is_zero() {
            return;
        }
        while !crate::shutdown::sleep_or_shutdown(every, &mut shutdown).await {
            let p = policies.clone();
            let _ = tokio::task::spawn_blocking(move || p.reload(false)).await;
        }
    }
}

/// The engine limits a config asks for. The pool's memory slots are sized for the largest cap
/// any merchant's plugin is given.
pub fn limits(config: &Config) -> RuntimeLimits {
    let mib = |m: u32| m as usize * (1 << 20);
    let largest = config
        .merchants
        .values()
        .filter_map(|m| m.plugin_max_memory_mib)
        .chain([config.runtime.max_memory_mib])
        .max()
        .unwrap_or(config.runtime.max_memory_mib);
    RuntimeLimits {
        deadline: config.runtime.deadline,
        max_memory_bytes: mib(config.runtime.max_memory_mib),
        max_plugin_memory_bytes: mib(largest),
        max_warm_instances: config.runtime.warm_instances as usize,
        warm_max_calls: config.runtime.warm_max_calls,
        warm_min_component_bytes: config.runtime.warm_min_component_kib as usize * 1024,
        ..RuntimeLimits::default()
    }
}

/// The limits of one merchant's plugin calls: its own `plugin_deadline` and
/// `plugin_max_memory_mib` when set, else `[runtime]`'s.
pub fn merchant_limits(config: &Config, merchant: &MerchantConfig) -> PluginLimits {
    PluginLimits {
        deadline: merchant.plugin_deadline.unwrap_or(config.runtime.deadline),
        max_memory_bytes: merchant
            .plugin_max_memory_mib
            .unwrap_or(config.runtime.max_memory_mib) as usize
            * (1 << 20),
    }
}

impl Policies {
    /// Loads every merchant's plugin. A plugin used by several merchants is compiled once, but
    /// each merchant gets its own warm instances ([`Plugin::fork`]).
    ///
    /// # Errors
    /// Every plugin that failed, each naming its merchant and why.
    pub fn load(config: &Config, engine: &PolicyEngine) -> Result<Policies, Vec<String>> {
        let (policies, mut problems, shadow_problems) = Policies::load_all(config, engine);
        problems.extend(shadow_problems);
        if problems.is_empty() {
            Ok(policies)
        } else {
            Err(problems)
        }
    }

    /// Every merchant whose plugin loads, and the others held ([`load_serving`]) with one
    /// problem each; then each shadow that loads, with one problem per shadow that does not.
    fn load_all(config: &Config, engine: &PolicyEngine) -> (Policies, Vec<String>, Vec<String>) {
        let mut held = HashMap::new();
        let mut loaded: HashMap<(PluginSource, PluginLimits), Plugin> = HashMap::new();
        let mut map = HashMap::new();
        let mut sources = HashMap::new();
        let mut problems = Vec::new();
        for (id, merchant) in &config.merchants {
            let source = Source {
                name: merchant.plugin.clone(),
                source: config.plugin_source(merchant),
                limits: merchant_limits(config, merchant),
                stamp: None,
            };
            let stamp = stamp(&source.source);
            let key = (source.source.clone(), source.limits);
            // Compiled once per (file, limits); each merchant owns its warm instances.
            let plugin = match loaded.get(&key) {
                Some(p) => Ok(p.fork()),
                None => load_source(engine, &source),
            };
            let settings: Vec<(String, String)> = merchant
                .settings
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let plugin = plugin.map_err(|e| e.to_string()).and_then(|plugin| {
                fits(&plugin, merchant.granted_effects.as_deref(), &settings).map(|()| plugin)
            });
            let breaker = Arc::new(Breaker::new(
                config.runtime.trip_after,
                config.runtime.trip_for.as_millis() as i64,
            ));
            match plugin {
                Ok(plugin) => {
                    loaded.insert(key, plugin.clone());
                    map.insert(
                        id.clone(),
                        Arc::new(MerchantPolicy {
                            merchant: id.clone(),
                            plugin,
                            settings,
                            breaker,
                            on_plugin_error: merchant.on_plugin_error,
                            granted_effects: merchant.granted_effects.clone(),
                        }),
                    );
                    sources.insert(id.clone(), Source { stamp, ..source });
                }
                Err(e) => {
                    problems.push(format!("merchants.{id}.plugin: {e}"));
                    held.insert(
                        id.clone(),
                        Held {
                            reason: e,
                            settings,
                            on_plugin_error: merchant.on_plugin_error,
                            granted_effects: merchant.granted_effects.clone(),
                            breaker,
                        },
                    );
                    sources.insert(id.clone(), Source { stamp, ..source });
                }
            }
        }
        let (shadows, shadow_problems) = load_shadows(config, engine);
        let policies = Policies {
            engine: engine.clone(),
            by_merchant: RwLock::new(map),
            sources: RwLock::new(sources),
            held: RwLock::new(held),
            shadows: RwLock::new(shadows),
        };
        (policies, problems, shadow_problems)
    }

    /// `merchant`'s shadow, if it has one that loaded.
    pub fn shadow(&self, merchant: &str) -> Option<Arc<ShadowPolicy>> {
        match self
            .shadows
            .read()
            .expect("shadow map lock poisoned")
            .get(merchant)
        {
            Some(Shadow::Asked(policy, _)) => Some(policy.clone()),
            Some(Shadow::Waiting(..)) | None => None,
        }
    }

    /// Why `merchant`'s plugin is not deciding, when it did not load ([`load_serving`]), and how
    /// long its trigger waits before it is looked at again, ms (`runtime.trip_for`): its
    /// triggers are held until a reload takes a good file.
    pub fn held(&self, merchant: &str) -> Option<(String, i64)> {
        self.held
            .read()
            .expect("held plugins lock poisoned")
            .get(merchant)
            .map(|h| (h.reason.clone(), h.breaker.trip_for_ms()))
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

    /// Merchants whose breaker is open at `now_ms`, and those whose plugin did not load
    /// ([`Policies::held`]): every merchant whose plugin is not deciding, sorted.
    pub fn tripped(&self, now_ms: i64) -> Vec<String> {
        let mut tripped: Vec<String> = self
            .all()
            .into_iter()
            .filter(|p| p.breaker.state(now_ms) == BreakerState::Open)
            .map(|p| p.merchant.clone())
            .chain(
                self.held
                    .read()
                    .expect("held plugins lock poisoned")
                    .keys()
                    .cloned(),
            )
            .collect();
        tripped.sort();
        tripped
    }

    /// The merchants whose plugin did not load at start and are held ([`load_serving`]):
    /// `(merchant, plugin as configured, why)`, by merchant.
    pub fn held_merchants(&self) -> Vec<(String, String, String)> {
        let held = self
            .held
            .read()
            .expect("held plugins lock poisoned")
            .clone();
        let sources = self.sources.read().expect("plugin sources lock poisoned");
        let mut out: Vec<(String, String, String)> = held
            .into_iter()
            .map(|(merchant, h)| {
                let plugin = sources
                    .get(&merchant)
                    .map(|s| s.name.clone())
                    .unwrap_or_default();
                (merchant, plugin, h.reason)
            })
            .collect();
        out.sort();
        out
    }

    /// Reloads the plugin files that changed on disk since they were loaded (all of them with
    /// `force`). Each new version is compiled and linked before it replaces the old; one that
    /// fails is refused and the old one keeps serving. Runs the compiler: call it off the async
    /// threads.
    pub fn reload(&self, force: bool) -> Vec<Reloaded> {
        let sources: Vec<(String, Source)> = self
            .sources
            .read()
            .expect("policy sources lock poisoned")
            .iter()
            .map(|(m, s)| (m.clone(), s.clone()))
            .collect();
        let mut report = Vec::new();
        for (merchant, source) in sources {
            let now_stamp = stamp(&source.source);
            let changed_on_disk = now_stamp != source.stamp;
            // Cloned out first: the read guard must be gone before `retry_held` writes.
            let held = self
                .held
                .read()
                .expect("held plugins lock poisoned")
                .get(&merchant)
                .cloned();
            if let Some(held) = held {
                if force || changed_on_disk {
                    report.push(self.retry_held(merchant, held, &source, now_stamp));
                } else {
                    report.push(Reloaded {
                        merchant,
                        digest: String::new(),
                        changed: false,
                        refused: Some(held.reason),
                        shadow: false,
                    });
                }
                continue;
            }
            let Some(current) = self.get(&merchant) else {
                continue;
            };
            if !(force || changed_on_disk) || matches!(source.source, PluginSource::Builtin(_)) {
                report.push(Reloaded {
                    merchant,
                    digest: current.plugin.digest().to_string(),
                    changed: false,
                    refused: None,
                    shadow: false,
                });
                continue;
            }
            let loaded = load_fitting(
                &self.engine,
                &source,
                current.granted_effects.as_deref(),
                &current.settings,
            );
            match loaded {
                Ok(plugin) if plugin.digest() == current.plugin.digest() => {
                    self.remember(&merchant, now_stamp);
                    report.push(Reloaded {
                        merchant,
                        digest: plugin.digest().to_string(),
                        changed: false,
                        refused: None,
                        shadow: false,
                    });
                }
                Ok(plugin) => {
                    let digest = plugin.digest().to_string();
                    let next = Arc::new(MerchantPolicy {
                        merchant: merchant.clone(),
                        plugin,
                        settings: current.settings.clone(),
                        breaker: current.breaker.clone(),
                        on_plugin_error: current.on_plugin_error,
                        granted_effects: current.granted_effects.clone(),
                    });
                    next.breaker.reset();
                    self.by_merchant
                        .write()
                        .expect("policy map lock poisoned")
                        .insert(merchant.clone(), next);
                    self.remember(&merchant, now_stamp);
                    tracing::warn!(%merchant, old = current.plugin.digest(), new = %digest, "plugin reloaded");
                    crate::events::emit(crate::events::Event::PluginReloaded {
                        merchant: &merchant,
                        outcome: "taken",
                    });
                    report.push(Reloaded {
                        merchant,
                        digest,
                        changed: true,
                        refused: None,
                        shadow: false,
                    });
                }
                Err(e) => {
                    // Remember the stamp so a bad file is reported once, not on every check.
                    self.remember(&merchant, now_stamp);
                    tracing::error!(%merchant, error = %e, "new plugin version refused; the old one keeps serving");
                    crate::events::emit(crate::events::Event::PluginReloaded {
                        merchant: &merchant,
                        outcome: "refused",
                    });
                    report.push(Reloaded {
                        merchant,
                        digest: current.plugin.digest().to_string(),
                        changed: false,
                        refused: Some(e),
                        shadow: false,
                    });
                }
            }
        }
        self.reload_shadows(force, &mut report);
        report.sort_by(|a, b| (&a.merchant, a.shadow).cmp(&(&b.merchant, b.shadow)));
        report
    }

    /// The shadows' part of [`Policies::reload`]: a changed shadow file (every one with
    /// `force`), or one that did not load before, is loaded and checked as a live plugin is,
    /// taken when it fits, refused (the old shadow asked on, or none) when not. Each is
    /// reported with `shadow: true`.
    fn reload_shadows(&self, force: bool, report: &mut Vec<Reloaded>) {
        let shadows: Vec<(String, Shadow)> = self
            .shadows
            .read()
            .expect("shadow map lock poisoned")
            .iter()
            .map(|(m, s)| (m.clone(), s.clone()))
            .collect();
        for (merchant, shadow) in shadows {
            let (parts, source, current) = match shadow {
                Shadow::Asked(policy, source) => (
                    ShadowPolicyParts {
                        settings: policy.settings.clone(),
                        granted_effects: policy.granted_effects.clone(),
                        sample: policy.sample,
                    },
                    source,
                    Some(policy),
                ),
                Shadow::Waiting(parts, source) => (parts, source, None),
            };
            let digest = current
                .as_ref()
                .map_or_else(String::new, |p| p.plugin.digest().to_string());
            let now_stamp = stamp(&source.source);
            let changed = force || now_stamp != source.stamp || current.is_none();
            let builtin = matches!(source.source, PluginSource::Builtin(_));
            if !changed || (current.is_some() && builtin) {
                report.push(Reloaded {
                    merchant,
                    digest,
                    changed: false,
                    refused: None,
                    shadow: true,
                });
                continue;
            }
            let loaded = load_fitting(
                &self.engine,
                &source,
                parts.granted_effects.as_deref(),
                &parts.settings,
            );
            let source = Source {
                stamp: now_stamp,
                ..source
            };
            let (entry, next) = match (loaded, current) {
                (Ok(plugin), Some(current)) if plugin.digest() == digest => {
                    (Shadow::Asked(current, source), (digest, false, None))
                }
                (Ok(plugin), _) => {
                    let digest = plugin.digest().to_string();
                    tracing::warn!(%merchant, new = %digest, "shadow plugin loaded by a reload");
                    let policy = Arc::new(ShadowPolicy {
                        merchant: merchant.clone(),
                        plugin,
                        settings: parts.settings,
                        granted_effects: parts.granted_effects,
                        sample: parts.sample,
                    });
                    (Shadow::Asked(policy, source), (digest, true, None))
                }
                (Err(e), current) => {
                    tracing::error!(%merchant, error = %e, "shadow plugin refused; the old one, if any, is asked on");
                    let entry = match current {
                        Some(p) => Shadow::Asked(p, source),
                        None => Shadow::Waiting(parts, source),
                    };
                    (entry, (digest, false, Some(e)))
                }
            };
            self.shadows
                .write()
                .expect("shadow map lock poisoned")
                .insert(merchant.clone(), entry);
            let (digest, changed, refused) = next;
            report.push(Reloaded {
                merchant,
                digest,
                changed,
                refused,
                shadow: true,
            });
        }
    }

    /// A held merchant's plugin file tried again: taken when it loads and fits (its triggers
    /// are decided from their next look), refused with the new reason when not.
    fn retry_held(
        &self,
        merchant: String,
        held: Held,
        source: &Source,
        now_stamp: Option<(SystemTime, u64)>,
    ) -> Reloaded {
        self.remember(&merchant, now_stamp);
        let loaded = load_fitting(
            &self.engine,
            source,
            held.granted_effects.as_deref(),
            &held.settings,
        );
        match loaded {
            Ok(plugin) => {
                let digest = plugin.digest().to_string();
                self.by_merchant
                    .write()
                    .expect("policy map lock poisoned")
                    .insert(
                        merchant.clone(),
                        Arc::new(MerchantPolicy {
                            merchant: merchant.clone(),
                            plugin,
                            settings: held.settings,
                            breaker: held.breaker,
                            on_plugin_error: held.on_plugin_error,
                            granted_effects: held.granted_effects,
                        }),
                    );
                self.held
                    .write()
                    .expect("held plugins lock poisoned")
                    .remove(&merchant);
                tracing::warn!(%merchant, new = %digest, "plugin loaded; the merchant's held triggers are decided again");
                crate::events::emit(crate::events::Event::PluginReloaded {
                    merchant: &merchant,
                    outcome: "taken",
                });
                Reloaded {
                    merchant,
                    digest,
                    changed: true,
                    refused: None,
                    shadow: false,
                }
            }
            Err(e) => {
                tracing::error!(%merchant, error = %e, "plugin still refused; the merchant's triggers stay held");
                crate::events::emit(crate::events::Event::PluginReloaded {
                    merchant: &merchant,
                    outcome: "refused",
                });
                if let Some(h) = self
                    .held
                    .write()
                    .expect("held plugins lock poisoned")
                    .get_mut(&merchant)
                {
                    h.reason = e.clone();
                }
                Reloaded {
                    merchant,
                    digest: String::new(),
                    changed: false,
                    refused: Some(e),
                    shadow: false,
                }
            }
        }
    }

    fn remember(&self, merchant: &str, stamp: Option<(SystemTime, u64)>) {
        if let Some(s) = self
            .sources
            .write()
            .expect("policy sources lock poisoned")
            .get_mut(merchant)
        {
            s.stamp = stamp;
        }
    }
}

/// Each merchant's `[merchants.<id>.shadow]` plugin, loaded with the merchant's limits and
/// checked against its settings and grants as a live plugin is; one problem per shadow that
/// does not load. Every shadow is returned with its source, the ones that did not load as
/// [`Shadow::Waiting`] (a later reload tries them again).
fn load_shadows(config: &Config, engine: &PolicyEngine) -> (HashMap<String, Shadow>, Vec<String>) {
    let (mut shadows, mut problems) = (HashMap::new(), Vec::new());
    for (id, merchant) in &config.merchants {
        let Some(shadow) = &merchant.shadow else {
            continue;
        };
        let mut source = Source {
            name: shadow.plugin.clone(),
            source: config.source_of(&shadow.plugin),
            limits: merchant_limits(config, merchant),
            stamp: None,
        };
        source.stamp = stamp(&source.source);
        let settings: Vec<(String, String)> = shadow
            .settings
            .as_ref()
            .unwrap_or(&merchant.settings)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let granted = merchant.granted_effects.clone();
        let loaded = load_fitting(engine, &source, granted.as_deref(), &settings);
        match loaded {
            Ok(plugin) => {
                let policy = Arc::new(ShadowPolicy {
                    merchant: id.clone(),
                    plugin,
                    settings,
                    granted_effects: granted,
                    sample: shadow.sample,
                });
                shadows.insert(id.clone(), Shadow::Asked(policy, source));
            }
            Err(e) => {
                problems.push(format!("merchants.{id}.shadow.plugin: {e}"));
                let waiting = ShadowPolicyParts {
                    settings,
                    granted_effects: granted,
                    sample: shadow.sample,
                };
                shadows.insert(id.clone(), Shadow::Waiting(waiting, source));
            }
        }
    }
    (shadows, problems)
}

/// Whether `plugin`'s manifest (API 0.2.0 on) fits its merchant's config: every kind it
/// declares is granted, every setting it needs is set with a value of its type, no setting is
/// set that it does not read. A 0.1.0 plugin declares nothing and always fits.
///
/// # Errors
/// Every problem, joined with `; `, e.g. `plugin `tea-house` does not fit the merchant's
/// config: settings.grace: ...`.
fn fits(
    plugin: &Plugin,
    granted: Option<&[String]>,
    settings: &[(String, String)],
) -> Result<(), String> {
    match plugin.manifest().map(|m| m.check_config(granted, settings)) {
        Some(Err(problems)) => Err(format!(
            "plugin `{}` (timeout:policy@{}) does not fit the merchant's config: {}",
            plugin.name(),
            plugin.api_version(),
            problems.join("; ")
        )),
        _ => Ok(()),
    }
}

/// A plugin file's modification time and size (none for built-ins or unreadable files).
fn stamp(source: &PluginSource) -> Option<(SystemTime, u64)> {
    match source {
        PluginSource::Builtin(_) => None,
        PluginSource::File(path) => {
            let meta = std::fs::metadata(PathBuf::from(path)).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        }
    }
}

/// A new version of a merchant's plugin, loaded and checked against its config ([`fits`]): what
/// a reload takes, for a serving merchant and a held one alike. The error names the reason.
fn load_fitting(
    engine: &PolicyEngine,
    source: &Source,
    granted: Option<&[String]>,
    settings: &[(String, String)],
) -> Result<Plugin, String> {
    let plugin = load_source(engine, source).map_err(|e| e.to_string())?;
    fits(&plugin, granted, settings).map(|()| plugin)
}

fn load_source(engine: &PolicyEngine, source: &Source) -> Result<Plugin, LoadError> {
    let name = &source.name;
    match &source.source {
        PluginSource::Builtin(builtin_name) => {
            let bytes = builtin(builtin_name).ok_or_else(|| LoadError::NotAComponent {
                plugin: name.to_string(),
                detail: format!("no built-in plugin named `{builtin_name}`"),
            })?;
            engine.load_with(name, bytes, source.limits)
        }
        PluginSource::File(path) => engine.load_file_with(name, path, source.limits),
    }
}

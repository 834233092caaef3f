//! A loaded plugin and the per-call sandbox around `decide` and `check`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Store, Trap};

use crate::bindings::VersionedPre;
use crate::engine::{InstanceMode, PluginLimits, PolicyEngine};
use crate::error::{DecideError, LoadError, TrapKind};
use crate::model::{CheckVerdict, Context, Decision, Effect, Manifest, Notice, Order};
use crate::state::CallState;
use crate::warm::Warm;

/// Ids of plugin loads, the owners of warm instances.
static NEXT_LOAD_ID: AtomicU64 = AtomicU64::new(1);

/// A compiled, linked policy plugin. Cheap to clone. Each call runs in a fresh `Store`, or —
/// for a heavy component, see [`InstanceMode`] — on a warm instance under the same limits.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<Inner>,
}

struct Inner {
    name: Arc<str>,
    digest: String,
    engine: PolicyEngine,
    pre: VersionedPre,
    /// What `describe` answered at load (API 0.2.0 on).
    manifest: Option<Manifest>,
    limits: PluginLimits,
    deadline_ticks: u64,
    mode: InstanceMode,
    /// Owner id of this load's warm instances.
    id: u64,
    /// Instances created so far (fresh or warm).
    instantiations: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.mode == InstanceMode::Warm {
            self.engine.warm().purge(self.id);
        }
    }
}

/// Which export a call runs.
enum Call<'a> {
    Decide(&'a Order, &'a Context),
    Check(&'a Order, &'a Context),
}

/// What a call returned, before it is judged.
enum Answer {
    Decision(Result<Decision, crate::model::PolicyError>),
    Verdict(CheckVerdict),
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name())
            .field("digest", &self.digest())
            .field("api_version", &self.api_version())
            .finish()
    }
}

impl Plugin {
    pub(crate) fn load(
        engine: PolicyEngine,
        name: &str,
        bytes: &[u8],
        limits: PluginLimits,
    ) -> Result<Self, LoadError> {
        let plugin = name.to_string();
        // Before compiling: a component, and (when the SDK stamped it) a version this host runs.
        let inspection = crate::inspect::inspect(name, bytes)?;
        let stamped = inspection.stamped_api_version;
        if let Some(found) = &stamped {
            check_supported(name, found)?;
        }
        let digest = hex::encode(Sha256::digest(bytes));
        let component = crate::cache::compile(&engine, bytes, &digest).map_err(|reason| {
            LoadError::Compile {
                plugin: plugin.clone(),
                stage: "compile",
                reason,
            }
        })?;
        let pre = link(&engine, &component, &plugin, stamped.as_deref())?;
        let deadline_ticks = engine.deadline_ticks(limits.deadline);
        let manifest = describe(&engine, &pre, name, limits, deadline_ticks)?;
        let mode = if bytes.len() >= engine.limits().warm_min_component_bytes
            && engine.limits().max_warm_instances > 0
        {
            InstanceMode::Warm
        } else {
            InstanceMode::Fresh
        };
        Ok(Plugin {
            inner: Arc::new(Inner {
                name: name.into(),
                digest,
                deadline_ticks,
                engine,
                pre,
                manifest,
                limits,
                mode,
                id: NEXT_LOAD_ID.fetch_add(1, Ordering::Relaxed),
                instantiations: AtomicU64::new(0),
            }),
        })
    }

    /// The same compiled component under a new owner of warm instances: what a second merchant
    /// using the same file with the same limits gets. Compilation is shared; warm instances
    /// (and any module-level state the guest keeps in them) never are, so one merchant's
    /// cached settings can never answer another merchant's orders.
    pub fn fork(&self) -> Plugin {
        let inner = &self.inner;
        Plugin {
            inner: Arc::new(Inner {
                name: inner.name.clone(),
                digest: inner.digest.clone(),
                engine: inner.engine.clone(),
                pre: inner.pre.clone(),
                manifest: inner.manifest.clone(),
                limits: inner.limits,
                deadline_ticks: inner.deadline_ticks,
                mode: inner.mode,
                id: NEXT_LOAD_ID.fetch_add(1, Ordering::Relaxed),
                instantiations: AtomicU64::new(0),
            }),
        }
    }

    /// The limits its calls run under.
    pub fn limits(&self) -> PluginLimits {
        self.inner.limits
    }

    /// Fresh instance per call, or warm instances (decided at load from the component's size).
    pub fn instance_mode(&self) -> InstanceMode {
        self.inner.mode
    }

    /// Instances created for this plugin so far: one per call in [`InstanceMode::Fresh`]; in
    /// [`InstanceMode::Warm`], one per warm instance (a new one after a failed call, after
    /// `warm_max_calls` calls, or when the pool had none idle).
    pub fn instantiations(&self) -> u64 {
        self.inner.instantiations.load(Ordering::Relaxed)
    }

    /// Idle warm instances of this plugin in the engine's pool.
    pub fn warm_instances(&self) -> usize {
        self.inner.engine.warm().idle(self.inner.id)
    }

    /// The name it was loaded under (the merchant's plugin name in the config).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// SHA-256 of the component bytes, lowercase hex; recorded with every decision.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// The `timeout:policy` version the plugin was built against, e.g. `0.1.0`.
    pub fn api_version(&self) -> &'static str {
        self.inner.pre.api_version()
    }

    /// Whether the daemon asks this plugin before an order's deadline (API 0.2.0 on). A 0.1.0
    /// plugin is first asked at the deadline; an earlier trigger is deferred to it unasked.
    pub fn asks_before_deadline(&self) -> bool {
        self.inner.pre.asks_before_deadline()
    }

    /// What the plugin declared at load (`describe`, API 0.2.0 on): its effect kinds and
    /// settings. `None` for a 0.1.0 plugin, which declares nothing.
    pub fn manifest(&self) -> Option<&Manifest> {
        self.inner.manifest.as_ref()
    }

    /// Asks the plugin what to do with `order` now.
    ///
    /// Runs under the plugin's [`PluginLimits`] (deadline, memory cap) on a fresh instance or a
    /// warm one ([`Plugin::instance_mode`]); blocks the calling thread for at most about the
    /// deadline.
    ///
    /// # Errors
    /// [`DecideError`]: the guest's own error, a trap, an oversized answer or a host problem.
    pub fn decide(&self, order: &Order, ctx: &Context) -> Result<Decision, DecideError> {
        match self.run(Call::Decide(order, ctx))? {
            Answer::Decision(Ok(decision)) => Ok(decision),
            Answer::Decision(Err(error)) => Err(DecideError::Policy {
                plugin: self.name().to_string(),
                error,
            }),
            Answer::Verdict(_) => unreachable!("decide answers a decision"),
        }
    }

    /// Asks the plugin to answer a transactional check-back for an order that exists.
    ///
    /// # Errors
    /// As [`Plugin::decide`], minus the guest's domain error (`check` has none).
    pub fn check(&self, order: &Order, ctx: &Context) -> Result<CheckVerdict, DecideError> {
        match self.run(Call::Check(order, ctx))? {
            Answer::Verdict(verdict) => Ok(verdict),
            Answer::Decision(_) => unreachable!("check answers a verdict"),
        }
    }

    /// One call: get an instance (warm or fresh), set the deadline, call, judge the answer, and
    /// give a warm instance back only when the call fully succeeded.
    fn run(&self, call: Call<'_>) -> Result<Answer, DecideError> {
        let (order, ctx) = match call {
            Call::Decide(o, c) | Call::Check(o, c) => (o, c),
        };
        let inner = &self.inner;
        let _running = inner.engine.running();
        let pool = inner.engine.warm();
        let warm = match inner.mode {
            InstanceMode::Warm => pool.take(inner.id),
            InstanceMode::Fresh => None,
        };
        let (mut store, instance, calls) = match warm {
            Some(w) => {
                let mut store = w.store;
                store.data_mut().begin_call(&order.id, ctx.now_ms);
                store.set_epoch_deadline(inner.deadline_ticks);
                (store, w.instance, w.calls)
            }
            None => {
                let state = CallState::new(
                    inner.name.clone(),
                    order.id.clone(),
                    ctx.now_ms,
                    inner.limits.max_memory_bytes,
                );
                let mut store = Store::new(inner.engine.engine(), state);
                store.limiter(|s| &mut s.limits);
                // One deadline for instantiation (it runs guest code: start functions) and the
                // call together, as before warm instances existed.
                store.set_epoch_deadline(inner.deadline_ticks);
                inner.instantiations.fetch_add(1, Ordering::Relaxed);
                let instance = inner
                    .pre
                    .instantiate(&mut store)
                    .map_err(|e| self.classify(e))?;
                (store, instance, 0)
            }
        };
        let answer = match call {
            Call::Decide(..) => instance
                .decide(&mut store, order, ctx)
                .map(Answer::Decision),
            Call::Check(..) => instance.check(&mut store, order, ctx).map(Answer::Verdict),
        }
        .map_err(|e| self.classify(e))?;
        if let Answer::Decision(Ok(decision)) = &answer {
            self.check_size(decision)?;
        }
        let succeeded = !matches!(answer, Answer::Decision(Err(_)));
        if inner.mode == InstanceMode::Warm
            && succeeded
            && calls + 1 < inner.engine.limits().warm_max_calls
        {
            pool.put(Warm {
                owner: inner.id,
                store,
                instance,
                calls: calls + 1,
            });
        }
        Ok(answer)
    }

    fn classify(&self, e: wasmtime::Error) -> DecideError {
        let plugin = self.name().to_string();
        let message = format!("{e:?}");
        match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => DecideError::Trap {
                plugin,
                kind: TrapKind::Deadline,
                message,
            },
            Some(_) => DecideError::Trap {
                plugin,
                kind: TrapKind::Fault,
                message,
            },
            // `StoreLimits` with `trap_on_grow_failure` reports a refused memory.grow this way.
            None if message.contains("forcing trap when growing memory") => DecideError::Trap {
                plugin,
                kind: TrapKind::Memory,
                message,
            },
            None => DecideError::Host {
                plugin,
                reason: message,
            },
        }
    }

    fn check_size(&self, decision: &Decision) -> Result<(), DecideError> {
        let limits = self.inner.engine.limits();
        let (max_str, max_n) = (limits.max_string_bytes, limits.max_effects);
        // Cheap checks first; field names are only built for the error.
        let too_long = |s: &str| s.len() > max_str;
        let notice_ok = |n: &Notice| {
            !too_long(&n.channel)
                && !too_long(&n.template)
                && n.params.len() <= max_n
                && n.params.iter().all(|(k, v)| !too_long(k) && !too_long(v))
        };
        let effect_ok = |e: &Effect| match e {
            Effect::RestoreStock { sku: a, .. }
            | Effect::RestoreFlashStock { activity: a, .. }
            | Effect::ReleaseCoupon { coupon: a }
            | Effect::ClosePayment { payment_ref: a } => !too_long(a),
            Effect::ReleaseFlashSlot { activity, user } => !too_long(activity) && !too_long(user),
            Effect::Notify(n) => notice_ok(n),
        };
        let problem = match decision {
            Decision::Wait { reminder, .. } => reminder
                .as_ref()
                .filter(|n| !notice_ok(n))
                .map(|_| "wait.reminder has an oversized field or too many params".to_string()),
            Decision::Ignore { reason } => {
                too_long(reason).then(|| format!("ignore.reason is {} bytes", reason.len()))
            }
            Decision::Cancel { reason, effects } => {
                if too_long(reason) {
                    Some(format!("cancel.reason is {} bytes", reason.len()))
                } else if effects.len() > max_n {
                    Some(format!(
                        "cancel has {} effects, limit {max_n}",
                        effects.len()
                    ))
                } else {
                    effects.iter().position(|e| !effect_ok(e)).map(|i| {
                        format!("cancel.effects[{i}] has an oversized field or too many params")
                    })
                }
            }
        };
        match problem {
            None => Ok(()),
            Some(reason) => Err(DecideError::Oversized {
                plugin: self.name().to_string(),
                reason: format!(
                    "{reason} (limits: {max_str} bytes per string, {max_n} effects or params)"
                ),
            }),
        }
    }
}

/// Calls the plugin's `describe` once, on a fresh instance under its limits (a 0.1.0 plugin
/// has none: `None`). A manifest naming a setting twice is refused.
fn describe(
    engine: &PolicyEngine,
    pre: &VersionedPre,
    name: &str,
    limits: PluginLimits,
    deadline_ticks: u64,
) -> Result<Option<Manifest>, LoadError> {
    let fail = |reason: String| LoadError::Compile {
        plugin: name.to_string(),
        stage: "describe",
        reason,
    };
    let _running = engine.running();
    let state = CallState::new(name.into(), String::new(), 0, limits.max_memory_bytes);
    let mut store = Store::new(engine.engine(), state);
    store.limiter(|s| &mut s.limits);
    store.set_epoch_deadline(deadline_ticks);
    let instance = pre
        .instantiate(&mut store)
        .map_err(|e| fail(format!("{e:?}")))?;
    let manifest = instance
        .describe(&mut store)
        .map_err(|e| fail(format!("{e:?}")))?;
    if let Some(m) = &manifest {
        for (i, s) in m.settings.iter().enumerate() {
            if m.settings[..i].iter().any(|t| t.name == s.name) {
                return Err(fail(format!(
                    "the manifest names setting `{}` twice",
                    s.name
                )));
            }
        }
    }
    Ok(manifest)
}

/// Links `component` against the bindings of the API version it was built against, plus
/// locked-down WASI. The version is its stamp when the SDK stamped it (`stamped`, already
/// checked), else the version of its `timeout:policy` imports, else the newest this host runs.
fn link(
    engine: &PolicyEngine,
    component: &Component,
    plugin: &str,
    stamped: Option<&str>,
) -> Result<VersionedPre, LoadError> {
    let version = match stamped {
        Some(v) => v.to_string(),
        None => policy_import_version(engine, component)
            .unwrap_or_else(|| crate::bindings::latest().to_string()),
    };
    check_supported(plugin, &version)?;
    let link_err = |(stage, reason): (&'static str, String)| LoadError::Compile {
        plugin: plugin.to_string(),
        stage,
        reason,
    };
    let mut linker: Linker<CallState> = Linker::new(engine.engine());
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
        .map_err(|e| link_err(("link", format!("{e:?}"))))?;
    crate::bindings::link(&version, linker, component).map_err(link_err)
}

/// Refuses a version not in [`crate::SUPPORTED_API_VERSIONS`], naming both.
fn check_supported(plugin: &str, found: &str) -> Result<(), LoadError> {
    let supported = crate::SUPPORTED_API_VERSIONS;
    if supported.contains(&found) {
        Ok(())
    } else {
        Err(LoadError::UnsupportedVersion {
            plugin: plugin.to_string(),
            found: found.to_string(),
            supported: supported.join(", "),
        })
    }
}

/// The version `X` of the first `timeout:policy/...@X` import, if any.
fn policy_import_version(engine: &PolicyEngine, component: &Component) -> Option<String> {
    let ty = component.component_type();
    ty.imports(engine.engine())
        .filter_map(|(name, _)| name.strip_prefix("timeout:policy/"))
        .find_map(|rest| rest.split_once('@').map(|(_, v)| v.to_string()))
}

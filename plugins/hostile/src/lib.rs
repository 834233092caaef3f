//! `hostile`: a policy plugin that misbehaves on request, for the sandbox and guard tests.
//! The `mode` setting picks the misbehaviour:
//! - `spin` — loops forever (the epoch deadline must trap it);
//! - `grow` — allocates far past any sane memory cap;
//! - `panic` — panics (a trap);
//! - `error` — returns `policy-error::internal`;
//! - `exceed` — cancels restoring 1000 units of its first SKU and another order's coupon;
//! - `flood` — cancels with 10 000 effects;
//! - `stall` — waits with `next-phase` equal to the current phase;
//! - `forever` — waits `u64::MAX` ms for its next phase;
//! - `recurse` — recurses without end (the guest's stack overflows: a trap);
//! - `coupon` — cancels releasing its own stock and the coupon of another order (`cpn-other`);
//! - `clock` — ignores, giving the WASI wall clock's reading (epoch ms) as the reason;
//! - `snoop` — ignores, reporting what it could reach: environment variables, the filesystem
//!   root, a TCP socket;
//! - `remember` — a single-phase close whose reason is `tag=<T>`, where `T` is the `tag`
//!   setting of the first call this instance served, cached in a `static` (module-level state a
//!   warm instance keeps: it must never reach another merchant);
//! - anything else — a well-behaved single-phase close.
//!
//! Built with `--no-default-features` it does without Rust's `std` (the SDK's allocator, panic
//! handler and `cabi_realloc` instead), so the same misbehaviour tests that runtime too; `clock`,
//! `snoop` and `remember` need `std` and then answer `ignore` saying so.

#![cfg_attr(not(feature = "std"), no_std)]

use timeoutd_policy_sdk::prelude::*;

use timeoutd_policy_sdk::{
    Cancel, CheckVerdict, Context, Decision, Effect, Guest, Order, PolicyError, Settings, Wait,
    release_everything,
};

struct Hostile;

impl Guest for Hostile {
    fn decide(order: Order, ctx: Context) -> Result<Decision, PolicyError> {
        let cancel = |effects| {
            Ok(Decision::Cancel(Cancel {
                reason: "hostile".into(),
                effects,
            }))
        };
        match Settings(&ctx.settings).text("mode", "ok") {
            "spin" => {
                let mut n: u64 = 0;
                loop {
                    n = core::hint::black_box(n.wrapping_add(1));
                }
            }
            "grow" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 16 << 20]);
                    core::hint::black_box(&hoard);
                }
            }
            "panic" => panic!("hostile plugin panics on order {}", order.id),
            "error" => Err(PolicyError::Internal("hostile plugin refuses".into())),
            "exceed" => cancel(vec![
                Effect::RestoreStock((order.items[0].sku.clone(), 1000)),
                Effect::ReleaseCoupon("someone-elses-coupon".into()),
            ]),
            "flood" => cancel(
                (0..10_000)
                    .map(|_| Effect::RestoreStock((order.items[0].sku.clone(), 0)))
                    .collect(),
            ),
            #[cfg(feature = "std")]
            "clock" => {
                // Reads the guest's WASI clock, which the host sets to `now`: what the test checks.
                #[expect(
                    clippy::disallowed_methods,
                    reason = "the guest's clock is the host's `now`; the test reads it back"
                )]
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0);
                Ok(Decision::Ignore(now.to_string()))
            }
            #[cfg(feature = "std")]
            "snoop" => Ok(Decision::Ignore(format!(
                "env={} fs={} tcp={}",
                std::env::vars().count(),
                std::fs::read_dir("/").is_ok(),
                std::net::TcpStream::connect("127.0.0.1:5432").is_ok()
            ))),
            "recurse" => Ok(Decision::Ignore(format!("depth {}", recurse(0)))),
            "coupon" => {
                let mut effects = release_everything(&order, false, None);
                effects.retain(|e| !matches!(e, Effect::ReleaseCoupon(_)));
                effects.push(Effect::ReleaseCoupon("cpn-other".into()));
                cancel(effects)
            }
            #[cfg(feature = "std")]
            "remember" => {
                static FIRST_TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
                let tag = FIRST_TAG.get_or_init(|| Settings(&ctx.settings).text("tag", "").into());
                Ok(Decision::Cancel(Cancel {
                    reason: format!("tag={tag}"),
                    effects: release_everything(&order, true, None),
                }))
            }
            "forever" => Ok(Decision::Wait(Wait {
                after_ms: u64::MAX,
                next_phase: ctx.phase + 1,
                reminder: None,
            })),
            "stall" => Ok(Decision::Wait(Wait {
                after_ms: 1000,
                next_phase: ctx.phase,
                reminder: None,
            })),
            #[cfg(not(feature = "std"))]
            mode @ ("clock" | "snoop" | "remember") => {
                Ok(Decision::Ignore(format!("mode `{mode}` needs std")))
            }
            _ => cancel(release_everything(&order, true, None)),
        }
    }

    fn check(_order: Order, _ctx: Context) -> CheckVerdict {
        CheckVerdict::Unknown
    }
}

/// Recurses until the stack runs out; the frame's array and `black_box` defeat tail calls and
/// inlining.
#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    let frame = core::hint::black_box([depth; 16]);
    recurse(depth + 1) + frame[depth as usize % 16]
}

timeoutd_policy_sdk::export_policy!(Hostile with_types_in timeoutd_policy_sdk::bindings);

//! What `std` would give a plugin built without it (the SDK's `std` feature off,
//! `wasm32-wasip2` only): a global allocator, the canonical ABI's `cabi_realloc`, and a panic
//! handler.
//!
//! Why: Rust's `std` on `wasm32-wasip2` brings the WASI runtime with it, so a component built
//! with it imports two dozen WASI interfaces that a pure decider never calls. The host
//! instantiates a fresh instance for every decision and must set up every import each time.
//! Without `std` the component imports nothing but `timeout:policy`, and a fresh-instance
//! decision costs about a fifth less (`plugins/README.md`, "Faster decisions").
//!
//! Shared by both SDKs: `timeoutd-policy-sdk` (0.2) and the frozen 0.1 SDK include this file.
//! It names the bindings through `crate::log` and `crate::Level`, which both re-export.

use core::alloc::{GlobalAlloc, Layout};
use core::fmt::Write;

// wasi-libc's `malloc` family (dlmalloc over `memory.grow`): the allocator `std` itself uses on
// this target, shipped with the Rust target (`self-contained/libc.a`) and importing nothing.
// Linking it also supplies `memcmp` / `bcmp`, which `core` calls. Not bundled into this rlib:
// the plugin's final link finds it, where rustc puts the target's self-contained libraries.
#[link(name = "c", kind = "static", modifiers = "-bundle")]
unsafe extern "C" {
    fn malloc(size: usize) -> *mut u8;
    fn aligned_alloc(align: usize, size: usize) -> *mut u8;
    fn realloc(ptr: *mut u8, size: usize) -> *mut u8;
    fn free(ptr: *mut u8);
}

/// The alignment `malloc` guarantees on wasm32 (as `std`'s `System` allocator assumes).
const MALLOC_ALIGN: usize = 8;

/// The global allocator: wasi-libc's `malloc`, `aligned_alloc` above [`MALLOC_ALIGN`].
struct Libc;

unsafe impl GlobalAlloc for Libc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain C allocation calls; a null return is the allocator's failure value.
        unsafe {
            if layout.align() <= MALLOC_ALIGN {
                malloc(layout.size())
            } else {
                aligned_alloc(layout.align(), layout.size())
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from `malloc` / `aligned_alloc` (GlobalAlloc's contract).
        unsafe { free(ptr) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above; an over-aligned block is moved by hand (C's `realloc` keeps only
        // `malloc`'s alignment).
        unsafe {
            if layout.align() <= MALLOC_ALIGN {
                return realloc(ptr, new_size);
            }
            let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                free(ptr);
            }
            new
        }
    }
}

#[global_allocator]
static ALLOCATOR: Libc = Libc;

/// The canonical ABI's allocation entry point, through which the host writes a call's
/// arguments (strings, lists) into the instance's memory: `old_len == 0` allocates `new_len`
/// bytes aligned to `align`, otherwise the block at `old_ptr` is resized. A failure traps.
/// Source: the Component Model's canonical ABI (`CanonicalABI.md`, `realloc`); `std` builds
/// get it from Rust's `std`.
#[unsafe(no_mangle)]
unsafe extern "C" fn cabi_realloc(
    old_ptr: *mut u8,
    old_len: usize,
    align: usize,
    new_len: usize,
) -> *mut u8 {
    // SAFETY: the canonical ABI passes a power-of-two `align` and, when `old_len != 0`, a
    // block it got from this function with that length and alignment.
    let ptr = unsafe {
        if old_len == 0 {
            if new_len == 0 {
                return align as *mut u8;
            }
            ALLOCATOR.alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            ALLOCATOR.realloc(
                old_ptr,
                Layout::from_size_align_unchecked(old_len, align),
                new_len,
            )
        }
    };
    if ptr.is_null() {
        core::arch::wasm32::unreachable();
    }
    ptr
}

/// Logs the panic's message and place through the host (`error`, tagged with the plugin and
/// order like any `log` line), then traps; the host reports the trap as the plugin's fault.
/// The message is formatted into a fixed buffer (truncated at 512 bytes): a panic raised by a
/// failed allocation must not allocate.
#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let mut line = Line::default();
    let _ = write!(line, "plugin panicked: {info}");
    crate::log(crate::Level::Error, line.as_str());
    core::arch::wasm32::unreachable()
}

/// A line of at most 512 bytes; what does not fit is cut at a character boundary.
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            buf: [0; 512],
            len: 0,
        }
    }
}

impl Line {
    fn as_str(&self) -> &str {
        // Only whole UTF-8 characters are copied in, so this never fails.
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("plugin panicked")
    }
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let mut n = s.len().min(self.buf.len() - self.len);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() {
            return Err(core::fmt::Error);
        }
        Ok(())
    }
}

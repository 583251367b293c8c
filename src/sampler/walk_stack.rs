//! Running the stack walk on a stack of our own.
//!
//! The handler runs on whatever stack the interrupted thread has, possibly a small
//! alternate signal stack (Rust installs 8 KiB ones) or a thread stack near exhaustion. A
//! DWARF walk needs ~17 KiB of stack in release builds (gimli's evaluation storage), so the
//! walk runs on a preallocated stack claimed with the sample's workspace; the handler itself
//! then needs only the kernel's signal frame and a few hundred bytes.

use crate::unwind::stack_reader::MAX_WINDOW_WORDS;
use std::ffi::c_void;

/// Stack given to each walk.
pub const WALK_STACK_BYTES: usize = 64 * 1024;

/// Memory for one walk: the frames it produces, the window it copies stack memory nothing
/// vouches for into (`unwind::StackReader`), and the stack it runs on.
pub struct Workspace {
    pub frames: Box<[u64]>,
    window: Box<[u64]>,
    stack: WalkStack,
}

/// A walk's stack: mapped on its own, so that the pages a walk never reaches cost nothing
/// (`in_program::pages`), or from the heap if the kernel refuses the mapping.
enum WalkStack {
    Pages(crate::in_program::pages::ZeroedWords),
    Heap(Box<[u64]>),
}

impl WalkStack {
    fn new() -> WalkStack {
        let words = WALK_STACK_BYTES / 8;
        match crate::in_program::pages::ZeroedWords::new(words) {
            Some(pages) => WalkStack::Pages(pages),
            None => WalkStack::Heap(vec![0; words].into_boxed_slice()),
        }
    }

    fn words(&mut self) -> &mut [u64] {
        match self {
            WalkStack::Pages(pages) => pages.as_mut_slice(),
            WalkStack::Heap(heap) => heap,
        }
    }
}

impl Workspace {
    pub fn new(max_depth: usize) -> Self {
        Workspace {
            frames: vec![0; max_depth.max(1)].into_boxed_slice(),
            window: vec![0; MAX_WINDOW_WORDS].into_boxed_slice(),
            stack: WalkStack::new(),
        }
    }

    /// Runs `f(frames, window)` on this workspace's stack and returns its result.
    /// Async-signal-safe; `f` must not unwind (panics abort at the `extern "C"` boundary).
    pub fn run<F: FnMut(&mut [u64], &mut [u64]) -> usize>(&mut self, mut f: F) -> usize {
        struct Call<'a, F> {
            f: &'a mut F,
            frames: &'a mut [u64],
            window: &'a mut [u64],
            result: usize,
        }
        extern "C" fn trampoline<F: FnMut(&mut [u64], &mut [u64]) -> usize>(call: *mut c_void) {
            // SAFETY: `call` is the `Call` passed below, alive for the duration of the call.
            let call = unsafe { &mut *(call as *mut Call<'_, F>) };
            call.result = (call.f)(call.frames, call.window);
        }
        let stack = self.stack.words();
        let top = (stack.as_mut_ptr() as usize + stack.len() * 8) & !15;
        let mut call = Call {
            f: &mut f,
            frames: &mut self.frames,
            window: &mut self.window,
            result: 0,
        };
        // SAFETY: `top` is the 16-byte aligned top of our own stack; the trampoline gets `call`,
        // alive until it returns.
        unsafe { crate::arch::call_on_stack(top, trampoline::<F>, &mut call as *mut Call<'_, F> as *mut c_void) };
        call.result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_on_its_own_stack_and_returns_the_result() {
        let mut ws = Workspace::new(8);
        let stack = ws.stack.words().as_ptr() as usize;
        let (lo, hi) = (stack, stack + WALK_STACK_BYTES);
        let n = ws.run(|frames, _| {
            let local = 0u8;
            let here = &local as *const u8 as usize;
            assert!(
                lo <= here && here < hi,
                "closure ran on {here:#x}, not on [{lo:#x}, {hi:#x})"
            );
            frames[0] = 42;
            3
        });
        assert_eq!(n, 3);
        assert_eq!(ws.frames[0], 42);
    }
}

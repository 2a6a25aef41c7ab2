//! The program's allocator: the system's, except for large blocks aligned beyond what
//! `malloc` guarantees, which are mapped straight from the kernel.
//!
//! The system allocator serves an over-aligned block with `posix_memalign`, and when the
//! block is asked for zeroed it then writes zeroes over all of it, touching every page at
//! once. polars keeps one such block, 8 MiB of zeroes aligned to 4 KiB, made the first time
//! it writes a parquet column that is null in every row (`cost_usd` under a mock model):
//! 2,048 page faults, a fifth of the CPU of a run of one episode. A fresh mapping is zero
//! already, and a page of it costs nothing until it is touched. (polars writes the block as
//! a `vec!` of a 4 KiB-aligned struct, which a release build turns into one zeroed
//! allocation; a debug build still writes every page.)
//!
//! Whether a block is mapped depends on its layout alone, so freeing it (which is given the
//! same layout) always undoes what allocating it did.

use std::alloc::{GlobalAlloc, Layout, System};

/// The smallest block that is mapped (when over-aligned).
const MAPPED_FROM: usize = 1 << 20;

/// The alignment `malloc` guarantees; the system allocator serves larger ones otherwise.
const MALLOC_ALIGN: usize = 16;

/// The alignment any mapping has.
const PAGE: usize = 4096;

/// The system's allocator, with large over-aligned blocks mapped: see the module's text.
pub struct Allocator;

fn mapped(layout: Layout) -> bool {
    cfg!(unix) && layout.align() > MALLOC_ALIGN && layout.align() <= PAGE && layout.size() >= MAPPED_FROM
}

#[cfg(unix)]
fn map(size: usize) -> *mut u8 {
    // SAFETY: a new private anonymous mapping, in no one else's memory.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if at == libc::MAP_FAILED { std::ptr::null_mut() } else { at.cast() }
}

#[cfg(unix)]
fn unmap(at: *mut u8, size: usize) {
    // SAFETY: `at` was mapped by `map` with this size, and its owner has let it go.
    unsafe { libc::munmap(at.cast(), size) };
}

#[cfg(not(unix))]
fn map(_size: usize) -> *mut u8 {
    unreachable!("nothing is mapped off Unix")
}

#[cfg(not(unix))]
fn unmap(_at: *mut u8, _size: usize) {
    unreachable!("nothing is mapped off Unix")
}

// SAFETY: mapped blocks are page-aligned (at least their layout's alignment, `mapped`
// checks), zeroed, and unmapped with the size they were mapped with; every other block is
// the system allocator's, allocated and freed by it.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's promises about `layout` hold for the system allocator too.
        if mapped(layout) { map(layout.size()) } else { unsafe { System.alloc(layout) } }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        if mapped(layout) { map(layout.size()) } else { unsafe { System.alloc_zeroed(layout) } }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator with `layout`, so by the same branch.
        if mapped(layout) { unmap(ptr, layout.size()) } else { unsafe { System.dealloc(ptr, layout) } }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller promises that `new_size`, rounded up to the alignment, fits in
        // an `isize`, which is what a layout needs.
        let grown = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !mapped(layout) && !mapped(grown) {
            // SAFETY: as `dealloc`: the block is the system allocator's, and stays so.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: a new block, then the old one's contents that fit, then the old one freed,
        // each by the branch its layout names.
        unsafe {
            let moved = self.alloc(grown);
            if !moved.is_null() {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            moved
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Page faults this thread has taken so far.
    fn faults() -> i64 {
        // SAFETY: `getrusage` fills the struct it is given.
        unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
            usage.ru_minflt + usage.ru_majflt
        }
    }

    #[test]
    fn a_large_over_aligned_zeroed_block_is_mapped_untouched_and_moves_whole() {
        let layout = Layout::from_size_align(8 << 20, 4096).unwrap();
        let before = faults();
        // SAFETY: a non-zero size; the block is freed below with its layout.
        let block = unsafe { Allocator.alloc_zeroed(layout) };
        let touched = faults() - before;
        assert!(!block.is_null());
        assert_eq!(block as usize % 4096, 0);
        // The system allocator writes the 2,048 pages' zeroes here; a mapping touches none.
        assert!(touched < 64, "{touched} page faults to allocate 8 MiB");
        // SAFETY: the block is 8 MiB long, and each move keeps what fits.
        unsafe {
            let bytes = std::slice::from_raw_parts_mut(block, layout.size());
            assert!(bytes.iter().step_by(4096).all(|b| *b == 0));
            for (i, b) in bytes.iter_mut().enumerate().step_by(4093) {
                *b = (i % 251) as u8 + 1;
            }
            // Larger, still mapped; then smaller than mapped blocks are; then back.
            let grown = Allocator.realloc(block, layout, 9 << 20);
            let small = Allocator.realloc(grown, Layout::from_size_align(9 << 20, 4096).unwrap(), 300_000);
            let kept = std::slice::from_raw_parts(small, 300_000);
            for (i, b) in kept.iter().enumerate().step_by(4093) {
                assert_eq!(*b, (i % 251) as u8 + 1, "byte {i}");
            }
            let again = Allocator.realloc(small, Layout::from_size_align(300_000, 4096).unwrap(), 2 << 20);
            let kept = std::slice::from_raw_parts(again, 300_000);
            assert!(kept.iter().enumerate().step_by(4093).all(|(i, b)| *b == (i % 251) as u8 + 1));
            Allocator.dealloc(again, Layout::from_size_align(2 << 20, 4096).unwrap());
        }
    }

    #[test]
    fn only_large_over_aligned_blocks_are_mapped() {
        let layout = |size, align| Layout::from_size_align(size, align).unwrap();
        assert!(mapped(layout(1 << 20, 4096)));
        assert!(mapped(layout(8 << 20, 32)));
        assert!(!mapped(layout((1 << 20) - 1, 4096)), "small");
        assert!(!mapped(layout(8 << 20, 16)), "what malloc aligns");
        assert!(!mapped(layout(8 << 20, 8192)), "beyond a page");
    }
}

//! System calls made without the C library, for the processes that share the runner's
//! memory (a command's keeper, and the shell it starts until its `exec`). The C library's
//! wrappers report failures in `errno`, which lives in the memory of the runner's thread
//! that started the keeper: a keeper writing it would change what that thread, or another
//! keeper started from it, reads as its own last error. These calls return the error
//! instead and write nothing but what the kernel fills in.
//!
//! On x86-64 they are the `syscall` instruction itself. Elsewhere they fall back to the C
//! library's `syscall` and `clone`, whose failures do go through `errno`: there a keeper
//! writes the `errno` of the runner's thread that started it (an EAGAIN after each wait, an
//! ECHILD at its end), which that thread may read as its own last error. Only x86-64 is
//! free of that.

use std::io;

/// Makes system call `number` with up to six arguments: its result, or the error it gave.
///
/// # Safety
/// The call and its arguments must be valid for this process; pointers among them must
/// point to what the kernel expects there.
#[inline(always)]
pub unsafe fn call(number: libc::c_long, args: &[usize]) -> io::Result<usize> {
    let mut a = [0usize; 6];
    a[..args.len()].copy_from_slice(args);
    #[cfg(target_arch = "x86_64")]
    {
        let result: isize;
        // SAFETY: the caller's promise; `syscall` clobbers rcx and r11 and nothing else.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") number as isize => result,
                in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
                in("r10") a[3], in("r8") a[4], in("r9") a[5],
                lateout("rcx") _, lateout("r11") _,
                options(nostack),
            );
        }
        if (-4095..0).contains(&result) {
            Err(io::Error::from_raw_os_error(-result as i32))
        } else {
            Ok(result as usize)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller's promise.
        let result = unsafe { libc::syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]) };
        if result == -1 { Err(io::Error::last_os_error()) } else { Ok(result as usize) }
    }
}

/// What a cloned child runs, on its own stack; it must not return.
pub type Entry = extern "C" fn(*mut libc::c_void) -> libc::c_int;

/// `clone(flags)` with the child running `entry(arg)` on the stack ending at `stack_top`
/// (16-byte aligned): the child's pid, to the parent.
///
/// # Safety
/// The stack must be mapped and writable, and stay so while the child runs on it; `arg`
/// must stay valid for as long as the child reads it. With `CLONE_VM`, the child shares
/// this process's memory: it may only use its stack and what `arg` points to, and make
/// system calls through [`call`].
pub unsafe fn clone(
    flags: libc::c_int,
    stack_top: *mut u8,
    entry: Entry,
    arg: *mut libc::c_void,
) -> io::Result<libc::pid_t> {
    #[cfg(target_arch = "x86_64")]
    {
        let result: isize;
        // SAFETY: the caller's promise. The child starts with the parent's registers but for
        // rax (0) and rsp (the new stack): it calls `entry(arg)` from r12 and r13 and never
        // comes back into this function; the parent goes on with the pid in rax.
        unsafe {
            std::arch::asm!(
                "syscall",
                "test rax, rax",
                "jnz 2f",
                "xor ebp, ebp",
                "mov rdi, r13",
                "call r12",
                "mov edi, eax",
                "mov eax, {exit}",
                "syscall",
                "ud2",
                "2:",
                exit = const libc::SYS_exit,
                inlateout("rax") libc::SYS_clone as isize => result,
                in("rdi") flags as usize, in("rsi") stack_top, in("rdx") 0usize,
                in("r10") 0usize, in("r8") 0usize,
                in("r12") entry, in("r13") arg,
                lateout("rcx") _, lateout("r11") _,
                options(nostack),
            );
        }
        if (-4095..0).contains(&result) {
            Err(io::Error::from_raw_os_error(-result as i32))
        } else {
            Ok(result as libc::pid_t)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller's promise.
        let pid = unsafe { libc::clone(entry, stack_top.cast(), flags, arg) };
        if pid < 0 { Err(io::Error::last_os_error()) } else { Ok(pid) }
    }
}

/// Ends this process (not its thread group: a keeper is a process of its own) with `code`.
pub fn exit(code: libc::c_int) -> ! {
    loop {
        // SAFETY: `exit` takes a number and does not come back.
        let _ = unsafe { call(libc::SYS_exit, &[code as usize]) };
    }
}

/// Writes all of `bytes` to `fd` (a pipe: short writes of a few bytes do not happen).
pub fn write(fd: libc::c_int, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: the kernel reads `bytes.len()` bytes from `bytes`.
    unsafe { call(libc::SYS_write, &[fd as usize, bytes.as_ptr() as usize, bytes.len()]) }
}

/// Closes `fd`.
pub fn close(fd: libc::c_int) {
    // SAFETY: closing a descriptor of this process.
    let _ = unsafe { call(libc::SYS_close, &[fd as usize]) };
}

/// Sends `signal` to `pid` (a process group when negative).
pub fn kill(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill only sends a signal.
    let _ = unsafe { call(libc::SYS_kill, &[pid as usize, signal as usize]) };
}

/// Reaps a child (`-1`: any); `Ok(0)` when none has ended and `WNOHANG` is given.
pub fn wait(pid: libc::pid_t, status: &mut libc::c_int, options: libc::c_int) -> io::Result<libc::pid_t> {
    // SAFETY: the kernel writes the status into `status`.
    unsafe {
        call(libc::SYS_wait4, &[pid as usize, status as *mut libc::c_int as usize, options as usize, 0])
            .map(|pid| pid as libc::pid_t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_is_its_error_and_a_good_one_its_result() {
        let e = unsafe { call(libc::SYS_close, &[999_999]) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        let pid = unsafe { call(libc::SYS_getpid, &[]) }.unwrap();
        assert_eq!(pid as u32, std::process::id());
    }

    /// A child sharing this memory writes what it is given and ends with the code it
    /// returns; the parent reaps it with that code.
    #[test]
    fn a_clone_runs_its_entry_on_its_stack_and_exits_with_its_result() {
        extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
            // SAFETY: `arg` is the parent's `u64`, alive until this child is reaped.
            unsafe { *arg.cast::<u64>() = 42 };
            7
        }
        let mut stack = vec![0u128; 4096];
        let top = unsafe { stack.as_mut_ptr().add(stack.len()).cast::<u8>() };
        let mut shared = 0u64;
        let pid =
            unsafe { clone(libc::CLONE_VM | libc::SIGCHLD, top, entry, (&mut shared as *mut u64).cast()) }.unwrap();
        let mut status = 0;
        assert_eq!(wait(pid, &mut status, 0).unwrap(), pid);
        assert!(libc::WIFEXITED(status), "{status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 7);
        assert_eq!(unsafe { std::ptr::read_volatile(&shared) }, 42);
    }
}

//! The calls into mlx-c: the crate's only `unsafe`.

use std::sync::Once;

use mlx_rs::{Array, Dtype, Stream};

use crate::Backend;

/// An owned MLX group handle. One from [`split`](RawGroup::split) is freed
/// on drop; one from [`init`] never is (see there).
#[derive(Debug)]
pub(crate) struct RawGroup {
    handle: mlx_sys::mlx_distributed_group,
    free_on_drop: bool,
}

// SAFETY: the handle points at a reference-counted C++ group object that MLX
// itself hands between its threads; moving the handle moves no state.
unsafe impl Send for RawGroup {}

impl Drop for RawGroup {
    fn drop(&mut self) {
        if self.free_on_drop {
            // SAFETY: we own the handle; it is not used after this.
            unsafe {
                mlx_sys::mlx_distributed_group_free(self.handle);
            }
        }
    }
}

/// MLX reports errors through a process-wide handler; mlx-rs installs its
/// own (which stores the message instead of exiting) on its first op. Our
/// calls bypass mlx-rs, so one cheap mlx-rs op makes sure it is installed.
fn ensure_error_handler() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Only its side effect matters: the op cannot fail on a valid shape.
        let _ = mlx_rs::ops::zeros::<f32>(&[1]);
    });
}

pub(crate) fn is_available(backend: Backend) -> bool {
    ensure_error_handler();
    // SAFETY: a static NUL-terminated name.
    unsafe { mlx_sys::mlx_distributed_is_available(backend.c_name().as_ptr()) }
}

/// `mx.distributed.init(strict, backend)`: a status, or the group.
///
/// The group's handle is never freed, so MLX never destroys the group: MLX
/// keeps every group `init` made in a process-wide registry anyway, until
/// the process exits, and there the ring group's destructor can hang for
/// ever. It stops each socket's worker thread by setting a flag and
/// notifying its condition variable without taking the worker's mutex, so a
/// worker that has just checked the flag and is about to wait misses the
/// notice, and the destructor joins it for ever (seen: a pipeline rank that
/// finished its work and never exited). Holding one reference to the end
/// skips that teardown; the kernel closes the sockets when the process
/// ends, as the destructor would have.
pub(crate) fn init(backend: Backend, strict: bool) -> Result<RawGroup, i32> {
    ensure_error_handler();
    // SAFETY: `res` is a fresh handle the call fills; the name is static.
    unsafe {
        let mut res = mlx_sys::mlx_distributed_group_new();
        let status = mlx_sys::mlx_distributed_init(&mut res, strict, backend.c_name().as_ptr());
        if status != 0 || res.ctx.is_null() {
            return Err(if status == 0 { -1 } else { status });
        }
        Ok(RawGroup {
            handle: res,
            free_on_drop: false,
        })
    }
}

impl RawGroup {
    pub(crate) fn rank(&self) -> i32 {
        // SAFETY: a live group handle.
        unsafe { mlx_sys::mlx_distributed_group_rank(self.handle) }
    }

    pub(crate) fn size(&self) -> i32 {
        // SAFETY: a live group handle.
        unsafe { mlx_sys::mlx_distributed_group_size(self.handle) }
    }

    pub(crate) fn split(&self, color: i32, key: i32) -> Result<RawGroup, i32> {
        // SAFETY: `res` is a fresh handle the call fills from a live group.
        unsafe {
            let mut res = mlx_sys::mlx_distributed_group_new();
            let status = mlx_sys::mlx_distributed_group_split(&mut res, self.handle, color, key);
            if status != 0 || res.ctx.is_null() {
                if !res.ctx.is_null() {
                    mlx_sys::mlx_distributed_group_free(res);
                }
                return Err(if status == 0 { -1 } else { status });
            }
            Ok(RawGroup {
                handle: res,
                free_on_drop: true,
            })
        }
    }
}

/// Which collective.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Collective {
    AllSum,
    AllGather,
    AllMax,
    AllMin,
    SumScatter,
}

/// Takes ownership of an array handle a call filled.
///
/// # Safety
/// `res` must be a handle MLX filled (or the empty one), used nowhere else.
unsafe fn finish(status: i32, res: mlx_sys::mlx_array) -> Result<Array, i32> {
    // SAFETY: the caller's contract; the array is freed on drop.
    let array = unsafe { Array::from_ptr(res) };
    if status == 0 {
        Ok(array)
    } else {
        Err(status)
    }
}

pub(crate) fn collective(op: Collective, x: &Array, group: &RawGroup) -> Result<Array, i32> {
    ensure_error_handler();
    let stream = Stream::thread_local_or_default();
    let f = match op {
        Collective::AllSum => mlx_sys::mlx_distributed_all_sum,
        Collective::AllGather => mlx_sys::mlx_distributed_all_gather,
        Collective::AllMax => mlx_sys::mlx_distributed_all_max,
        Collective::AllMin => mlx_sys::mlx_distributed_all_min,
        Collective::SumScatter => mlx_sys::mlx_distributed_sum_scatter,
    };
    // SAFETY: `res` is a fresh array the call fills; every argument outlives
    // the call.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = f(&mut res, x.as_ptr(), group.handle, stream.as_ptr());
        finish(status, res)
    }
}

pub(crate) fn send(x: &Array, dst: i32, group: &RawGroup) -> Result<Array, i32> {
    ensure_error_handler();
    let stream = Stream::thread_local_or_default();
    // SAFETY: as in `collective`.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status =
            mlx_sys::mlx_distributed_send(&mut res, x.as_ptr(), dst, group.handle, stream.as_ptr());
        finish(status, res)
    }
}

pub(crate) fn recv_like(x: &Array, src: i32, group: &RawGroup) -> Result<Array, i32> {
    ensure_error_handler();
    let stream = Stream::thread_local_or_default();
    // SAFETY: as in `collective`.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_distributed_recv_like(
            &mut res,
            x.as_ptr(),
            src,
            group.handle,
            stream.as_ptr(),
        );
        finish(status, res)
    }
}

pub(crate) fn recv(shape: &[i32], dtype: Dtype, src: i32, group: &RawGroup) -> Result<Array, i32> {
    ensure_error_handler();
    let stream = Stream::thread_local_or_default();
    // SAFETY: as in `collective`; the shape slice outlives the call.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_distributed_recv(
            &mut res,
            shape.as_ptr(),
            shape.len(),
            dtype.into(),
            src,
            group.handle,
            stream.as_ptr(),
        );
        finish(status, res)
    }
}

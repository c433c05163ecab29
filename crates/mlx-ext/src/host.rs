//! Host buffers handed to MLX without a copy, for the float kernels that
//! compute outside its graph ([`crate::softmax`], [`crate::swiglu`]).
//! Buffers MLX lets go of are kept for the next call: a fresh buffer of
//! attention's size costs more in page faults than the softmax itself.

use mlx_rs::Array;

use std::sync::Mutex;

/// Buffers kept at most.
const KEPT: usize = 8;

static FREE: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// A zeroed buffer of `len` floats, reused where one is big enough.
pub(crate) fn take(len: usize) -> Vec<f32> {
    let mut out = take_empty(len);
    out.resize(len, 0.0);
    out
}

/// An empty buffer with room for `len` floats, reused where one is big
/// enough: for a caller that writes every element.
pub(crate) fn take_empty(len: usize) -> Vec<f32> {
    let reused = FREE.lock().ok().and_then(|mut free| {
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= len)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i)?;
        Some(free.swap_remove(best))
    });
    let mut out = reused.unwrap_or_default();
    out.clear();
    out.reserve(len);
    out
}

/// Keeps `buffer` for a later [`take`], dropping the smallest kept one
/// when there are enough.
pub(crate) fn give(buffer: Vec<f32>) {
    let Ok(mut free) = FREE.lock() else { return };
    free.push(buffer);
    if free.len() > KEPT {
        if let Some(smallest) = (0..free.len()).min_by_key(|i| free[*i].capacity()) {
            free.swap_remove(smallest);
        }
    }
}

/// An array over `data` without a copy: MLX frees the vector when it
/// drops the buffer. Falls back to a copy if MLX refuses the pointer.
pub(crate) fn hand_over(data: Vec<f32>, shape: &[i32]) -> Array {
    unsafe extern "C" fn free(payload: *mut std::ffi::c_void) {
        // SAFETY: `payload` is the box `hand_over` leaked, given back once.
        give(*unsafe { Box::from_raw(payload.cast::<Vec<f32>>()) });
    }
    crate::quant::ensure_error_handler();
    let mut boxed = Box::new(data);
    let ptr = boxed.as_mut_ptr();
    let payload = Box::into_raw(boxed);
    // SAFETY: `ptr` points at `shape`'s product of floats owned by
    // `payload`, which lives until MLX calls `free` with it.
    let array = unsafe {
        mlx_sys::mlx_array_new_data_managed_payload(
            ptr.cast(),
            shape.as_ptr(),
            shape.len() as i32,
            mlx_sys::mlx_dtype__MLX_FLOAT32,
            payload.cast(),
            Some(free),
        )
    };
    if array.ctx.is_null() {
        // SAFETY: MLX refused the buffer and dropped its deleter uncalled.
        let data = unsafe { Box::from_raw(payload) };
        return Array::from_slice(&data, shape);
    }
    // SAFETY: a fresh array MLX returned, owned by us from here.
    unsafe { Array::from_ptr(array) }
}

//! MLX's quantization in every mode MLX 0.32.2 offers: `affine` (a scale and
//! a bias per group, in the weight's dtype) and the floating-point formats
//! `mxfp4`, `nvfp4`, `mxfp8` (one `uint8` scale per group, no biases).
//!
//! mlx-rs 0.33's `quantize`, `dequantize`, `quantized_matmul` and
//! `gather_qmm` always pass the mode `"affine"`; the C functions under them
//! take the mode as a string. [`Packed`] calls those C functions with the
//! mode, after checking what MLX would refuse (mode parameters, dtypes,
//! shapes), so bad input is a [`QuantError`] naming the problem. The `unsafe`
//! here is the calls themselves (as in [`crate::rope`]).

use std::ffi::CStr;
use std::fmt;
use std::str::FromStr;
use std::sync::Once;

use mlx_rs::{Array, Dtype, Stream};

/// Bits MLX's affine quantization offers.
pub const AFFINE_BITS: &[i32] = &[2, 3, 4, 5, 6, 8];
/// Group sizes MLX's affine quantization offers.
pub const AFFINE_GROUP_SIZES: &[i32] = &[32, 64, 128];

/// A quantization mode, named as MLX and mlx-lm name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantMode {
    /// `w = scale * q + bias` per group; scales and biases in the weight's dtype.
    Affine,
    /// OCP MX FP4 (E2M1) with a power-of-two (E8M0) scale per 32 elements.
    Mxfp4,
    /// NVIDIA FP4 (E2M1) with an FP8 (E4M3) scale per 16 elements.
    Nvfp4,
    /// OCP MX FP8 (E4M3) with a power-of-two (E8M0) scale per 32 elements.
    Mxfp8,
}

impl QuantMode {
    /// Every mode, in MLX's documentation order.
    pub const ALL: [QuantMode; 4] = [Self::Affine, Self::Mxfp4, Self::Nvfp4, Self::Mxfp8];

    /// The name MLX and mlx-lm use (`"affine"`, `"mxfp4"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Affine => "affine",
            Self::Mxfp4 => "mxfp4",
            Self::Nvfp4 => "nvfp4",
            Self::Mxfp8 => "mxfp8",
        }
    }

    fn c_name(self) -> &'static CStr {
        match self {
            Self::Affine => c"affine",
            Self::Mxfp4 => c"mxfp4",
            Self::Nvfp4 => c"nvfp4",
            Self::Mxfp8 => c"mxfp8",
        }
    }

    /// The group size and bits used when none are given (`mlx.nn`'s and
    /// mlx-lm's defaults for the mode).
    pub fn default_params(self) -> QuantParams {
        let (group_size, bits) = match self {
            Self::Affine => (64, 4),
            Self::Mxfp4 => (32, 4),
            Self::Nvfp4 => (16, 4),
            Self::Mxfp8 => (32, 8),
        };
        QuantParams {
            mode: self,
            group_size,
            bits,
        }
    }

    /// Whether MLX quantizes with this group size and bit width in this
    /// mode (each floating-point mode takes exactly its default pair).
    pub fn accepts(self, group_size: i32, bits: i32) -> bool {
        match self {
            Self::Affine => AFFINE_GROUP_SIZES.contains(&group_size) && AFFINE_BITS.contains(&bits),
            _ => {
                let d = self.default_params();
                (group_size, bits) == (d.group_size, d.bits)
            }
        }
    }

    /// What [`accepts`](Self::accepts) allows, for error messages.
    pub fn accepted(self) -> &'static str {
        match self {
            Self::Affine => "group size 32|64|128 with 2|3|4|5|6|8 bits",
            Self::Mxfp4 => "group size 32 with 4 bits only",
            Self::Nvfp4 => "group size 16 with 4 bits only",
            Self::Mxfp8 => "group size 32 with 8 bits only",
        }
    }

    /// Whether the packed form has a `biases` tensor (affine only).
    pub fn has_biases(self) -> bool {
        self == Self::Affine
    }
}

impl fmt::Display for QuantMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for QuantMode {
    type Err = QuantError;

    fn from_str(s: &str) -> Result<Self, QuantError> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| QuantError::UnknownMode(s.to_owned()))
    }
}

/// Mode, group size and bits of one quantized matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantParams {
    /// The format.
    pub mode: QuantMode,
    /// Elements sharing a scale (and a bias, in affine mode).
    pub group_size: i32,
    /// Bits per element.
    pub bits: i32,
}

impl QuantParams {
    /// Affine parameters (not checked; see [`check`](Self::check)).
    pub const fn affine(group_size: i32, bits: i32) -> Self {
        Self {
            mode: QuantMode::Affine,
            group_size,
            bits,
        }
    }

    /// `mode` with the given group size and bits, each defaulting to the
    /// mode's as `mlx.nn.quantize` defaults them; checked.
    pub fn new(
        mode: QuantMode,
        group_size: Option<i32>,
        bits: Option<i32>,
    ) -> Result<Self, QuantError> {
        let d = mode.default_params();
        Self {
            mode,
            group_size: group_size.unwrap_or(d.group_size),
            bits: bits.unwrap_or(d.bits),
        }
        .check()
    }

    /// Itself, if MLX accepts the pair in this mode.
    pub fn check(self) -> Result<Self, QuantError> {
        if self.mode.accepts(self.group_size, self.bits) {
            Ok(self)
        } else {
            Err(QuantError::Unsupported {
                mode: self.mode,
                group_size: self.group_size,
                bits: self.bits,
            })
        }
    }
}

impl fmt::Display for QuantParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (group size {}, {} bits)",
            self.mode, self.group_size, self.bits
        )
    }
}

/// What went wrong in a quantization op.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// A mode name MLX does not know.
    #[error("unknown quantization mode `{0}` (MLX offers affine, mxfp4, nvfp4, mxfp8)")]
    UnknownMode(String),
    /// A group size and bit width the mode does not take.
    #[error("{mode} quantization does not take group size {group_size} with {bits} bits (it takes {})", mode.accepted())]
    Unsupported {
        /// The mode.
        mode: QuantMode,
        /// The group size asked for.
        group_size: i32,
        /// The bits asked for.
        bits: i32,
    },
    /// Inputs MLX would refuse: wrong dtype, rank or dimensions.
    #[error("{op} ({params}): {message}")]
    Input {
        /// The operation.
        op: &'static str,
        /// Its quantization parameters.
        params: QuantParams,
        /// What is wrong.
        message: String,
    },
    /// MLX returned an error status for inputs that passed our checks.
    #[error("{op} ({params}): MLX refused the operation (status {status})")]
    Refused {
        /// The operation.
        op: &'static str,
        /// Its quantization parameters.
        params: QuantParams,
        /// The status MLX returned.
        status: i32,
    },
    /// An mlx-rs operation around the call failed.
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
}

/// A matrix, or a stack of matrices on leading axes, as MLX packs it:
/// `weight` (`uint32`, `[..., out, in * bits / 32]`), `scales`
/// (`[..., out, in / group_size]`: `uint8` in the floating-point modes, the
/// weight's floating dtype in affine mode) and, in affine mode only,
/// `biases` (the scales' shape and dtype).
#[derive(Debug, Clone)]
pub struct Packed {
    weight: Array,
    scales: Array,
    biases: Option<Array>,
    params: QuantParams,
}

impl Packed {
    /// Quantizes `w` (floating, rank >= 2, last dimension a multiple of the
    /// group size) as `mx.quantize(w, group_size, bits, mode=mode)` does.
    pub fn quantize(w: &Array, params: QuantParams) -> Result<Self, QuantError> {
        const OP: &str = "quantize";
        let params = params.check()?;
        let bad = |message: String| QuantError::Input {
            op: OP,
            params,
            message,
        };
        if !is_floating(w.dtype()) {
            return Err(bad(format!("a {:?} array is not floating", w.dtype())));
        }
        if w.ndim() < 2 {
            return Err(bad(format!("shape {:?}: rank below 2", w.shape())));
        }
        let columns = w.dim(-1);
        if columns % params.group_size != 0 {
            return Err(bad(format!(
                "last dimension {columns} is not a multiple of the group size"
            )));
        }
        ensure_error_handler();
        let stream = Stream::thread_local_or_default();
        let no_scale = empty_array();
        // SAFETY: `res` is a fresh vector the call fills; the arrays, the
        // mode string and the stream outlive the call.
        let arrays = unsafe {
            let mut res = mlx_sys::mlx_vector_array_new();
            let status = mlx_sys::mlx_quantize(
                &mut res,
                w.as_ptr(),
                optional(params.group_size),
                optional(params.bits),
                params.mode.c_name().as_ptr(),
                no_scale.as_ptr(),
                stream.as_ptr(),
            );
            let arrays = take_vector(res);
            if status != 0 {
                return Err(QuantError::Refused {
                    op: OP,
                    params,
                    status,
                });
            }
            arrays
        };
        let mut parts = arrays.into_iter();
        let (Some(weight), Some(scales)) = (parts.next(), parts.next()) else {
            return Err(bad("MLX returned fewer than two arrays".into()));
        };
        Self::from_parts(weight, scales, parts.next(), params)
    }

    /// Packed parts as stored (a checkpoint's `weight`, `scales`, `biases`),
    /// checked against each other and the mode.
    pub fn from_parts(
        weight: Array,
        scales: Array,
        biases: Option<Array>,
        params: QuantParams,
    ) -> Result<Self, QuantError> {
        const OP: &str = "packed weights";
        let params = params.check()?;
        let bad = |message: String| QuantError::Input {
            op: OP,
            params,
            message,
        };
        if weight.dtype() != Dtype::Uint32 {
            return Err(bad(format!("weight is {:?}, not Uint32", weight.dtype())));
        }
        if params.mode.has_biases() {
            if !is_floating(scales.dtype()) {
                return Err(bad(format!(
                    "scales are {:?}, not floating",
                    scales.dtype()
                )));
            }
        } else if scales.dtype() != Dtype::Uint8 {
            return Err(bad(format!("scales are {:?}, not Uint8", scales.dtype())));
        }
        let (ws, ss) = (weight.shape(), scales.shape());
        let lead = ws.len().saturating_sub(1);
        if ws.len() < 2 || ss.len() != ws.len() || ws[..lead] != ss[..lead] {
            return Err(bad(format!(
                "weight {ws:?} and scales {ss:?} do not pair up"
            )));
        }
        let in_from_weight = i64::from(ws[lead]) * 32;
        let in_from_scales = i64::from(ss[lead]) * i64::from(params.group_size);
        if in_from_weight != in_from_scales * i64::from(params.bits) {
            return Err(bad(format!(
                "weight {ws:?} and scales {ss:?} imply different input sizes"
            )));
        }
        match (&biases, params.mode.has_biases()) {
            (Some(b), true) if b.shape() != ss || b.dtype() != scales.dtype() => {
                return Err(bad(format!(
                    "biases {:?} {:?} differ from scales {ss:?} {:?}",
                    b.dtype(),
                    b.shape(),
                    scales.dtype()
                )))
            }
            (None, true) => return Err(bad("affine quantization needs biases".into())),
            (Some(_), false) => {
                return Err(bad(format!("{} quantization has no biases", params.mode)))
            }
            _ => {}
        }
        Ok(Self {
            weight,
            scales,
            biases,
            params,
        })
    }

    /// The parameters.
    pub fn params(&self) -> QuantParams {
        self.params
    }

    /// The packed weight.
    pub fn weight(&self) -> &Array {
        &self.weight
    }

    /// The scales.
    pub fn scales(&self) -> &Array {
        &self.scales
    }

    /// The biases (affine mode only).
    pub fn biases(&self) -> Option<&Array> {
        self.biases.as_ref()
    }

    /// `(weight, scales, biases)`, as a checkpoint stores them.
    pub fn into_parts(self) -> (Array, Array, Option<Array>) {
        (self.weight, self.scales, self.biases)
    }

    /// The unpacked last dimension.
    pub fn in_dim(&self) -> i32 {
        self.scales.dim(-1) * self.params.group_size
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        self.weight.nbytes() + self.scales.nbytes() + self.biases.as_ref().map_or(0, Array::nbytes)
    }

    /// Evaluates the parts.
    pub fn eval(&self) -> Result<(), QuantError> {
        let mut parts = vec![&self.weight, &self.scales];
        parts.extend(self.biases.as_ref());
        Ok(mlx_rs::transforms::eval(parts)?)
    }

    /// `mx.dequantize` with the mode: the float matrix, in the scales'
    /// dtype (affine) or MLX's default for the mode (bfloat16 for the
    /// floating-point ones).
    pub fn dequantize(&self) -> Result<Array, QuantError> {
        const OP: &str = "dequantize";
        ensure_error_handler();
        let stream = Stream::thread_local_or_default();
        let no_scale = empty_array();
        let no_biases = empty_array();
        let biases = self.biases.as_ref().unwrap_or(&no_biases);
        let no_dtype = mlx_sys::mlx_optional_dtype {
            value: mlx_sys::mlx_dtype__MLX_FLOAT32,
            has_value: false,
        };
        // SAFETY: `res` is a fresh array the call fills; every argument
        // outlives the call.
        unsafe {
            let mut res = mlx_sys::mlx_array_new();
            let status = mlx_sys::mlx_dequantize(
                &mut res,
                self.weight.as_ptr(),
                self.scales.as_ptr(),
                biases.as_ptr(),
                optional(self.params.group_size),
                optional(self.params.bits),
                self.params.mode.c_name().as_ptr(),
                no_scale.as_ptr(),
                no_dtype,
                stream.as_ptr(),
            );
            self.result(OP, status, res)
        }
    }

    /// `x W^T` (`transpose`) or `x W`, as `mx.quantized_matmul` with the
    /// mode; `x` is floating with its last dimension the one contracted.
    pub fn matmul(&self, x: &Array, transpose: bool) -> Result<Array, QuantError> {
        const OP: &str = "quantized_matmul";
        self.check_input(OP, x, transpose)?;
        ensure_error_handler();
        let stream = Stream::thread_local_or_default();
        let no_biases = empty_array();
        let biases = self.biases.as_ref().unwrap_or(&no_biases);
        // SAFETY: as in `dequantize`.
        unsafe {
            let mut res = mlx_sys::mlx_array_new();
            let status = mlx_sys::mlx_quantized_matmul(
                &mut res,
                x.as_ptr(),
                self.weight.as_ptr(),
                self.scales.as_ptr(),
                biases.as_ptr(),
                transpose,
                optional(self.params.group_size),
                optional(self.params.bits),
                self.params.mode.c_name().as_ptr(),
                stream.as_ptr(),
            );
            self.result(OP, status, res)
        }
    }

    /// `mx.gather_qmm` with the mode: rows of `x` (gathered by `lhs`) times
    /// the matrices of the stack `rhs` names.
    pub fn gather_matmul(
        &self,
        x: &Array,
        lhs: Option<&Array>,
        rhs: Option<&Array>,
        transpose: bool,
        sorted: bool,
    ) -> Result<Array, QuantError> {
        const OP: &str = "gather_qmm";
        self.check_input(OP, x, transpose)?;
        for (which, indices) in [("lhs", lhs), ("rhs", rhs)] {
            if let Some(i) = indices.filter(|i| !is_integer(i.dtype())) {
                return Err(QuantError::Input {
                    op: OP,
                    params: self.params,
                    message: format!("{which} indices are {:?}, not integers", i.dtype()),
                });
            }
        }
        ensure_error_handler();
        let stream = Stream::thread_local_or_default();
        let none = empty_array();
        let biases = self.biases.as_ref().unwrap_or(&none);
        // SAFETY: as in `dequantize`.
        unsafe {
            let mut res = mlx_sys::mlx_array_new();
            let status = mlx_sys::mlx_gather_qmm(
                &mut res,
                x.as_ptr(),
                self.weight.as_ptr(),
                self.scales.as_ptr(),
                biases.as_ptr(),
                lhs.unwrap_or(&none).as_ptr(),
                rhs.unwrap_or(&none).as_ptr(),
                transpose,
                optional(self.params.group_size),
                optional(self.params.bits),
                self.params.mode.c_name().as_ptr(),
                sorted,
                stream.as_ptr(),
            );
            self.result(OP, status, res)
        }
    }

    /// The rows `ids` names along axis 0 (a quantized embedding lookup):
    /// still packed, with the same parameters.
    pub fn take_rows(&self, ids: &Array) -> Result<Self, QuantError> {
        let rows = |a: &Array| a.take_axis(ids, 0);
        Ok(Self {
            weight: rows(&self.weight)?,
            scales: rows(&self.scales)?,
            biases: self.biases.as_ref().map(rows).transpose()?,
            params: self.params,
        })
    }

    fn check_input(&self, op: &'static str, x: &Array, transpose: bool) -> Result<(), QuantError> {
        let inner = if transpose {
            self.in_dim()
        } else {
            self.weight.dim(-2)
        };
        let message = if !is_floating(x.dtype()) {
            format!("input is {:?}, not floating", x.dtype())
        } else if x.ndim() == 0 || x.dim(-1) != inner {
            format!(
                "input {:?} does not end in the contracted size {inner}",
                x.shape()
            )
        } else {
            return Ok(());
        };
        Err(QuantError::Input {
            op,
            params: self.params,
            message,
        })
    }

    /// The array a call filled, or its error.
    ///
    /// # Safety
    /// `res` must be the array the call filled (or left empty).
    unsafe fn result(
        &self,
        op: &'static str,
        status: i32,
        res: mlx_sys::mlx_array,
    ) -> Result<Array, QuantError> {
        // SAFETY: the caller's contract; the array is freed on drop.
        let array = unsafe { Array::from_ptr(res) };
        if status == 0 {
            Ok(array)
        } else {
            Err(QuantError::Refused {
                op,
                params: self.params,
                status,
            })
        }
    }
}

fn is_floating(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16)
}

fn is_integer(dtype: Dtype) -> bool {
    matches!(
        dtype,
        Dtype::Uint8
            | Dtype::Uint16
            | Dtype::Uint32
            | Dtype::Uint64
            | Dtype::Int8
            | Dtype::Int16
            | Dtype::Int32
            | Dtype::Int64
    )
}

fn optional(value: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int {
        value,
        has_value: true,
    }
}

/// MLX's "no array" (a null handle), freed on drop.
pub(crate) fn empty_array() -> Array {
    // SAFETY: `mlx_array_new` returns an empty handle the Array owns.
    unsafe { Array::from_ptr(mlx_sys::mlx_array_new()) }
}

/// The arrays of a vector MLX filled, which is freed.
///
/// # Safety
/// `vec` must be a valid vector handle, not used afterwards.
unsafe fn take_vector(vec: mlx_sys::mlx_vector_array) -> Vec<Array> {
    // SAFETY: the caller's contract; each element is copied out into an
    // array we own before the vector is freed.
    unsafe {
        let n = mlx_sys::mlx_vector_array_size(vec);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut a = mlx_sys::mlx_array_new();
            mlx_sys::mlx_vector_array_get(&mut a, vec, i);
            out.push(Array::from_ptr(a));
        }
        mlx_sys::mlx_vector_array_free(vec);
        out
    }
}

/// MLX reports errors through a process-wide handler; mlx-rs installs its
/// own (which stores the message instead of exiting) on its first op. Our
/// calls bypass mlx-rs, so one cheap mlx-rs op makes sure it is installed.
pub(crate) fn ensure_error_handler() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Only its side effect matters: the op cannot fail on a valid shape.
        let _ = mlx_rs::ops::zeros::<f32>(&[1]);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(shape: &[i32], seed: u64) -> Array {
        let key = mlx_rs::random::key(seed).expect("key");
        mlx_rs::random::normal::<f32>(shape, None, None, &key).expect("normal")
    }

    fn max_abs_diff(a: &Array, b: &Array) -> f32 {
        let d = a
            .as_dtype(Dtype::Float32)
            .and_then(|a| a.subtract(b.as_dtype(Dtype::Float32)?))
            .and_then(|d| mlx_rs::ops::abs(&d))
            .and_then(|d| d.max(None))
            .expect("difference");
        d.item_cast::<f32>()
    }

    #[test]
    fn modes_parse_from_mlx_lm_names_and_refuse_others() {
        for mode in QuantMode::ALL {
            assert_eq!(mode.as_str().parse::<QuantMode>().expect("parse"), mode);
        }
        let err = "mxfp6".parse::<QuantMode>().expect_err("unknown");
        assert!(err.to_string().contains("`mxfp6`"), "{err}");
    }

    #[test]
    fn each_mode_accepts_what_mlx_accepts() {
        for mode in QuantMode::ALL {
            let d = mode.default_params();
            assert!(mode.accepts(d.group_size, d.bits), "{mode} defaults");
        }
        assert!(QuantMode::Affine.accepts(128, 3));
        assert!(!QuantMode::Affine.accepts(16, 4));
        assert!(!QuantMode::Mxfp4.accepts(64, 4));
        assert!(!QuantMode::Nvfp4.accepts(32, 4));
        assert!(!QuantMode::Mxfp8.accepts(32, 4));
        let err = QuantParams::new(QuantMode::Mxfp4, Some(64), None).expect_err("group 64");
        assert!(err.to_string().contains("group size 64"), "{err}");
        assert_eq!(
            QuantParams::new(QuantMode::Nvfp4, None, None).expect("defaults"),
            QuantParams {
                mode: QuantMode::Nvfp4,
                group_size: 16,
                bits: 4
            }
        );
    }

    /// Quantize then dequantize, per mode: the packed layout MLX documents
    /// and a round-trip error within the format's resolution (for N(0, 1)
    /// weights: 4-bit formats a quarter of the largest value, 8-bit ones
    /// less than a tenth), and `quantized_matmul` equal to a matmul with the
    /// dequantized weights up to float rounding.
    #[test]
    fn every_mode_round_trips_and_multiplies_like_its_dequantized_matrix() {
        let w = random(&[16, 128], 1);
        let x = random(&[3, 128], 2);
        let bounds = [
            (QuantMode::Affine, 0.35),
            (QuantMode::Mxfp4, 1.1),
            (QuantMode::Nvfp4, 0.8),
            (QuantMode::Mxfp8, 0.3),
        ];
        for (mode, bound) in bounds {
            let params = mode.default_params();
            let packed = Packed::quantize(&w, params).expect("quantize");
            assert_eq!(packed.weight().shape(), &[16, 128 * params.bits / 32]);
            assert_eq!(packed.scales().shape(), &[16, 128 / params.group_size]);
            assert_eq!(packed.biases().is_some(), mode == QuantMode::Affine);
            if mode != QuantMode::Affine {
                assert_eq!(packed.scales().dtype(), Dtype::Uint8, "{mode}");
            }
            let dense = packed.dequantize().expect("dequantize");
            assert_eq!(dense.shape(), w.shape());
            let err = max_abs_diff(&dense, &w);
            assert!(err > 0.0 && err < bound, "{mode}: round trip error {err}");

            let ours = packed.matmul(&x, true).expect("quantized_matmul");
            let reference = x
                .matmul(dense.as_dtype(Dtype::Float32).expect("f32").t())
                .expect("matmul");
            let diff = max_abs_diff(&ours, &reference);
            assert!(diff < 1e-4, "{mode}: quantized_matmul off by {diff}");

            // Not transposed: `x W` with W stored [in, out].
            let wt = random(&[128, 64], 3);
            let packed_t = Packed::quantize(&wt, params).expect("quantize");
            let dense_t = packed_t.dequantize().expect("dequantize");
            let ours = packed_t.matmul(&x, false).expect("x W");
            let reference = x
                .matmul(dense_t.as_dtype(Dtype::Float32).expect("f32"))
                .expect("matmul");
            assert!(max_abs_diff(&ours, &reference) < 1e-4, "{mode}: x W");
        }
    }

    #[test]
    fn gather_matmul_picks_each_rows_matrix_in_every_mode() {
        let stack = random(&[3, 8, 64], 4);
        let x = random(&[2, 1, 64], 5);
        let indices = Array::from_slice(&[2u32, 0], &[2]);
        for mode in QuantMode::ALL {
            let packed = Packed::quantize(&stack, mode.default_params()).expect("quantize");
            let got = packed
                .gather_matmul(&x, None, Some(&indices), true, false)
                .expect("gather_qmm");
            let dense = packed
                .dequantize()
                .expect("dequantize")
                .as_dtype(Dtype::Float32)
                .expect("f32");
            for (row, expert) in [(0, 2), (1, 0)] {
                let reference = x
                    .take_axis(Array::from_int(row), 0)
                    .and_then(|xr| xr.matmul(dense.take_axis(Array::from_int(expert), 0)?.t()))
                    .expect("reference");
                let ours = got.take_axis(Array::from_int(row), 0).expect("row");
                let diff = max_abs_diff(
                    &ours.reshape(&[1, 8]).expect("r"),
                    &reference.reshape(&[1, 8]).expect("r"),
                );
                assert!(diff < 1e-4, "{mode}: row {row} off by {diff}");
            }
        }
    }

    #[test]
    fn taken_rows_dequantize_to_the_rows_of_the_matrix() {
        let w = random(&[10, 64], 6);
        let ids = Array::from_slice(&[7u32, 1, 7], &[3]);
        for mode in QuantMode::ALL {
            let packed = Packed::quantize(&w, mode.default_params()).expect("quantize");
            let rows = packed
                .take_rows(&ids)
                .expect("rows")
                .dequantize()
                .expect("dequantize");
            let all = packed
                .dequantize()
                .expect("dequantize")
                .take_axis(&ids, 0)
                .expect("take");
            assert_eq!(max_abs_diff(&rows, &all), 0.0, "{mode}");
        }
    }

    #[test]
    fn bad_shapes_and_parts_are_errors_not_aborts() {
        let w = random(&[4, 96], 7);
        // 96 is not a multiple of 64 (affine default).
        let err = Packed::quantize(&w, QuantMode::Affine.default_params()).expect_err("96 % 64");
        assert!(
            err.to_string().contains("not a multiple of the group size"),
            "{err}"
        );
        let err = Packed::quantize(&random(&[64], 8), QuantMode::Mxfp4.default_params())
            .expect_err("rank 1");
        assert!(err.to_string().contains("rank below 2"), "{err}");
        let err = Packed::quantize(
            &w,
            QuantParams {
                mode: QuantMode::Nvfp4,
                group_size: 32,
                bits: 4,
            },
        )
        .expect_err("nvfp4 group 32");
        assert!(
            err.to_string()
                .contains("nvfp4 quantization does not take group size 32"),
            "{err}"
        );

        let packed = Packed::quantize(&random(&[4, 64], 9), QuantMode::Mxfp8.default_params())
            .expect("quantize");
        let err = packed
            .matmul(&random(&[2, 32], 10), true)
            .expect_err("wrong width");
        assert!(err.to_string().contains("contracted size 64"), "{err}");
        let ids = Array::from_slice(&[0.5f32], &[1]);
        let err = packed
            .gather_matmul(&random(&[1, 64], 11), None, Some(&ids), true, false)
            .expect_err("float indices");
        assert!(err.to_string().contains("not integers"), "{err}");

        // Passes our checks, fails MLX's (batch 2 against a stack of 3):
        // MLX's error status, not an abort.
        let stack = Packed::quantize(&random(&[3, 8, 64], 14), QuantMode::Nvfp4.default_params())
            .expect("stack");
        let err = stack
            .matmul(&random(&[2, 1, 64], 15), true)
            .expect_err("batch 2 vs 3");
        assert!(matches!(err, QuantError::Refused { .. }), "{err}");

        let (weight, scales, _) = packed.into_parts();
        let fake_biases = mlx_rs::ops::zeros::<f32>(scales.shape()).expect("zeros");
        let err = Packed::from_parts(
            weight,
            scales,
            Some(fake_biases),
            QuantMode::Mxfp8.default_params(),
        )
        .expect_err("biases in mxfp8");
        assert!(
            err.to_string().contains("mxfp8 quantization has no biases"),
            "{err}"
        );

        let affine =
            Packed::quantize(&random(&[4, 64], 12), QuantParams::affine(32, 4)).expect("affine");
        let (weight, scales, _) = affine.into_parts();
        let err = Packed::from_parts(weight, scales, None, QuantParams::affine(32, 4))
            .expect_err("no biases");
        assert!(err.to_string().contains("needs biases"), "{err}");

        // Scales of another mode's dtype, and a weight too narrow for them.
        let fp = Packed::quantize(&random(&[4, 64], 13), QuantMode::Mxfp4.default_params())
            .expect("mxfp4");
        let (weight, scales, _) = fp.into_parts();
        let err = Packed::from_parts(
            weight,
            scales.as_dtype(Dtype::Float32).expect("cast"),
            None,
            QuantMode::Mxfp4.default_params(),
        )
        .expect_err("float scales");
        assert!(err.to_string().contains("not Uint8"), "{err}");
        let narrow = mlx_rs::ops::zeros::<u32>(&[4, 4]).expect("zeros");
        let scales = mlx_rs::ops::zeros::<u8>(&[4, 2]).expect("zeros");
        let err = Packed::from_parts(narrow, scales, None, QuantMode::Mxfp4.default_params())
            .expect_err("4 * 32 / 4 != 2 * 32");
        assert!(err.to_string().contains("different input sizes"), "{err}");
    }
}

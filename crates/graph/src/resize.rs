//! Resizing the two spatial axes of an NCHW tensor (ONNX's `Resize`, PyTorch's
//! `interpolate`): the operator's parameters and the one mapping from output coordinates to
//! input elements ([`Resize::taps`]) that the reference executor and every kernel read, so
//! they cannot disagree about it.
//!
//! Each output row (column) maps back to a real input coordinate by the coordinate mode, with
//! the axis' scale, as ONNX defines it (in `f32`, as onnxruntime computes it); `nearest` takes
//! the input element that coordinate rounds to, `linear` the two around it, weighted by
//! distance, the coordinate first clamped into the input. An output element of a 2-D resize is
//! `sum over rows r, columns s of wr * ws * x[r, s]` over the two taps of its row and column.

use serde::{Deserialize, Serialize};

use crate::limits::check_param;

/// How an output element is computed from the input around its coordinate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResizeMode {
    /// The input element the coordinate rounds to (by [`NearestMode`]).
    #[default]
    Nearest,
    /// Linear interpolation between the two input elements around the coordinate (bilinear
    /// over both axes).
    Linear,
}

/// How an output coordinate maps back to an input coordinate (ONNX's
/// `coordinate_transformation_mode`; `x` output index, `s` scale, `lr`/`lo` output and input
/// lengths).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResizeCoord {
    /// `(x + 0.5) / s - 0.5` (ONNX's default).
    #[default]
    HalfPixel,
    /// `(x + 0.5) / s - 0.5`, 0 where `lr` is 1 (PyTorch's bilinear, `align_corners=False`).
    PytorchHalfPixel,
    /// `x * (lo - 1) / (lr - 1)`, 0 where `lr` is 1 (`align_corners=True`).
    AlignCorners,
    /// `x / s` (PyTorch's nearest).
    Asymmetric,
    /// `(x + 0.5) / s` (TensorFlow's nearest).
    TfHalfPixelForNn,
    /// Half pixel about the centre of the input where `lr` is not exactly `s * lo` (opset 19).
    HalfPixelSymmetric,
}

/// Which input element a coordinate between two takes (ONNX's `nearest_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NearestMode {
    /// The nearest, the lower one at exactly half (ONNX's default).
    #[default]
    RoundPreferFloor,
    /// The nearest, the upper one at exactly half.
    RoundPreferCeil,
    Floor,
    Ceil,
}

/// Resize the spatial axes of `[n, c, h, w]` to `[n, c, size[0], size[1]]`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resize {
    /// Output height and width.
    pub size: [usize; 2],
    /// The scales the coordinate modes divide by, per axis (ONNX's `scales` where the model
    /// gives them, which may differ from `size / input`); absent: `size / input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<[f32; 2]>,
    #[serde(default)]
    pub mode: ResizeMode,
    #[serde(default)]
    pub coord: ResizeCoord,
    #[serde(default)]
    pub nearest: NearestMode,
}

impl Eq for Resize {}

/// Where one output row or column reads: `w_lo * x[lo] + w_hi * x[hi]` (nearest: `x[lo]`,
/// `hi == lo`, weights 1 and 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tap {
    pub lo: usize,
    pub hi: usize,
    pub w_lo: f32,
    pub w_hi: f32,
}

impl Tap {
    /// The output element at row tap `row` and column tap `col` from the input elements
    /// `[x[row.lo, col.lo], x[row.lo, col.hi], x[row.hi, col.lo], x[row.hi, col.hi]]`:
    /// onnxruntime's bilinear sum (each product of weights first), or for `nearest` the first
    /// element itself (a product by a zero weight would turn an infinity into NaN).
    pub fn blend(mode: ResizeMode, row: &Tap, col: &Tap, x: [f32; 4]) -> f32 {
        match mode {
            ResizeMode::Nearest => x[0],
            ResizeMode::Linear => {
                row.w_lo * col.w_lo * x[0]
                    + row.w_lo * col.w_hi * x[1]
                    + row.w_hi * col.w_lo * x[2]
                    + row.w_hi * col.w_hi * x[3]
            }
        }
    }
}

impl Resize {
    /// Nearest-neighbour resize to `size` (scale `size / input`).
    pub fn nearest(size: [usize; 2], coord: ResizeCoord, nearest: NearestMode) -> Resize {
        Resize {
            size,
            scale: None,
            mode: ResizeMode::Nearest,
            coord,
            nearest,
        }
    }

    /// Bilinear resize to `size` (scale `size / input`).
    pub fn linear(size: [usize; 2], coord: ResizeCoord) -> Resize {
        Resize {
            size,
            scale: None,
            mode: ResizeMode::Linear,
            coord,
            nearest: NearestMode::default(),
        }
    }

    /// The output shape for input `x` (`[n, c, h, w]`), checking the parameters.
    pub fn out_shape(&self, x: &[usize]) -> Result<Vec<usize>, String> {
        let [n, c, _, _] = x else {
            return Err(format!(
                "resize expects a 4-D input [n, c, h, w], got {x:?}"
            ));
        };
        for (axis, &s) in ["height", "width"].iter().zip(&self.size) {
            check_param(&format!("resize {axis}"), s)?;
            if s == 0 {
                return Err(format!("resize {axis} must be positive"));
            }
        }
        if let Some(scale) = self.scale {
            if scale.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
                return Err(format!(
                    "resize scales {scale:?} must be finite and positive"
                ));
            }
        }
        Ok(vec![*n, *c, self.size[0], self.size[1]])
    }

    /// The scale of `axis` (0 rows, 1 columns) for an input of `input` elements along it.
    pub fn axis_scale(&self, axis: usize, input: usize) -> f32 {
        match self.scale {
            Some(s) => s[axis],
            None => self.size[axis] as f32 / input as f32,
        }
    }

    /// The taps of every output index along `axis` (0 rows, 1 columns) of an input `input`
    /// long: `size[axis]` of them, each index below `input`.
    pub fn taps(&self, axis: usize, input: usize) -> Vec<Tap> {
        let out = self.size[axis];
        let scale = self.axis_scale(axis, input);
        let last = input.saturating_sub(1);
        (0..out)
            .map(|x| {
                let orig = self.original(x, out, input, scale);
                match self.mode {
                    ResizeMode::Nearest => {
                        let i = round(orig, self.nearest).clamp(0.0, last as f32) as usize;
                        Tap {
                            lo: i,
                            hi: i,
                            w_lo: 1.0,
                            w_hi: 0.0,
                        }
                    }
                    ResizeMode::Linear => {
                        // onnxruntime's bilinear: the coordinate clamped into the input, the
                        // two elements around it weighted by distance (0.5 each at the edge).
                        let c = orig.clamp(0.0, last as f32);
                        let lo = (c as usize).min(last);
                        let hi = (lo + 1).min(last);
                        let (w_lo, w_hi) = if lo == hi {
                            (0.5, 0.5)
                        } else {
                            ((hi as f32 - c).abs(), (c - lo as f32).abs())
                        };
                        Tap { lo, hi, w_lo, w_hi }
                    }
                }
            })
            .collect()
    }

    /// The input coordinate of output index `x` (ONNX's coordinate transformation, in `f32`).
    fn original(&self, x: usize, out: usize, input: usize, scale: f32) -> f32 {
        let (x, lr, lo) = (x as f32, out as f32, input as f32);
        match self.coord {
            ResizeCoord::HalfPixel => (x + 0.5) / scale - 0.5,
            ResizeCoord::PytorchHalfPixel if out > 1 => (x + 0.5) / scale - 0.5,
            ResizeCoord::PytorchHalfPixel => 0.0,
            ResizeCoord::AlignCorners if out > 1 => x * (lo - 1.0) / (lr - 1.0),
            ResizeCoord::AlignCorners => 0.0,
            ResizeCoord::Asymmetric => x / scale,
            ResizeCoord::TfHalfPixelForNn => (x + 0.5) / scale,
            ResizeCoord::HalfPixelSymmetric => {
                let adjustment = lr / (scale * lo);
                let offset = lo / 2.0 * (1.0 - adjustment);
                offset + (x + 0.5) / scale - 0.5
            }
        }
    }
}

impl ResizeMode {
    fn name(self) -> &'static str {
        match self {
            ResizeMode::Nearest => "nearest",
            ResizeMode::Linear => "linear",
        }
    }
}

impl ResizeCoord {
    fn name(self) -> &'static str {
        match self {
            ResizeCoord::HalfPixel => "half_pixel",
            ResizeCoord::PytorchHalfPixel => "pytorch_half_pixel",
            ResizeCoord::AlignCorners => "align_corners",
            ResizeCoord::Asymmetric => "asymmetric",
            ResizeCoord::TfHalfPixelForNn => "tf_half_pixel_for_nn",
            ResizeCoord::HalfPixelSymmetric => "half_pixel_symmetric",
        }
    }
}

impl NearestMode {
    fn name(self) -> &'static str {
        match self {
            NearestMode::RoundPreferFloor => "round_prefer_floor",
            NearestMode::RoundPreferCeil => "round_prefer_ceil",
            NearestMode::Floor => "floor",
            NearestMode::Ceil => "ceil",
        }
    }
}

/// One short line, the names as in the JSON: `nearest 32x32 asymmetric floor`,
/// `linear 7x7 half_pixel scale 1.5x1.5`.
impl std::fmt::Display for Resize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [h, w] = self.size;
        write!(f, "{} {h}x{w} {}", self.mode.name(), self.coord.name())?;
        if self.mode == ResizeMode::Nearest {
            write!(f, " {}", self.nearest.name())?;
        }
        if let Some([a, b]) = self.scale {
            write!(f, " scale {a}x{b}")?;
        }
        Ok(())
    }
}

/// `v` rounded to an integer by `mode`.
fn round(v: f32, mode: NearestMode) -> f32 {
    match mode {
        NearestMode::RoundPreferFloor if v == v.floor() + 0.5 => v.floor(),
        NearestMode::RoundPreferFloor | NearestMode::RoundPreferCeil => v.round(),
        NearestMode::Floor => v.floor(),
        NearestMode::Ceil => v.ceil(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn nearest_indices(r: &Resize, input: usize) -> Vec<usize> {
        r.taps(1, input).iter().map(|t| t.lo).collect()
    }

    #[test]
    fn nearest_follows_the_coordinate_and_rounding_modes() {
        use NearestMode::*;
        use ResizeCoord::*;
        // PyTorch's nearest: asymmetric, floor. Twice 3 wide repeats every column.
        let r = Resize::nearest([1, 6], Asymmetric, Floor);
        assert_eq!(nearest_indices(&r, 3), [0, 0, 1, 1, 2, 2]);
        // ONNX's default, half pixel + round prefer floor, 4 -> 3: 1/6, 3/2 (half: floor), 17/6.
        let r = Resize::nearest([1, 3], HalfPixel, RoundPreferFloor);
        assert_eq!(nearest_indices(&r, 4), [0, 1, 3]);
        let r = Resize::nearest([1, 3], HalfPixel, RoundPreferCeil);
        assert_eq!(nearest_indices(&r, 4), [0, 2, 3]);
        // Ceil past the end clamps to the last element.
        let r = Resize::nearest([1, 5], Asymmetric, Ceil);
        assert_eq!(nearest_indices(&r, 2), [0, 1, 1, 1, 1]);
        // Align corners maps the ends onto the ends.
        let r = Resize::nearest([1, 4], AlignCorners, RoundPreferFloor);
        assert_eq!(nearest_indices(&r, 7), [0, 2, 4, 6]);
    }

    #[test]
    fn linear_weights_sum_to_one_and_clamp_at_the_edges() {
        // PyTorch's bilinear (align_corners=False) doubling 2 elements: coordinates -0.25,
        // 0.25, 0.75, 1.25, clamped into [0, 1].
        let r = Resize::linear([1, 4], ResizeCoord::PytorchHalfPixel);
        let t = r.taps(1, 2);
        let got: Vec<(usize, usize, f32, f32)> =
            t.iter().map(|t| (t.lo, t.hi, t.w_lo, t.w_hi)).collect();
        assert_eq!(
            got,
            [
                (0, 1, 1.0, 0.0),
                (0, 1, 0.75, 0.25),
                (0, 1, 0.25, 0.75),
                (1, 1, 0.5, 0.5)
            ]
        );
        for coord in [
            ResizeCoord::HalfPixel,
            ResizeCoord::AlignCorners,
            ResizeCoord::Asymmetric,
            ResizeCoord::HalfPixelSymmetric,
        ] {
            for (out, input) in [(7, 3), (3, 7), (1, 5), (5, 1)] {
                let r = Resize::linear([1, out], coord);
                for t in r.taps(1, input) {
                    assert!(t.lo <= t.hi && t.hi < input, "{coord:?} {t:?}");
                    assert!((t.w_lo + t.w_hi - 1.0).abs() < 1e-6, "{coord:?} {t:?}");
                }
            }
        }
    }

    #[test]
    fn given_scales_win_over_the_size_ratio() {
        // ONNX's scale 0.7 on 5 elements: 3 outputs at (x + 0.5) / 0.7 - 0.5 = 0.21, 1.64,
        // 3.07; by the size ratio 0.6 they would be 0.33, 2, 3.67.
        let mut r = Resize::nearest(
            [1, 3],
            ResizeCoord::HalfPixel,
            NearestMode::RoundPreferFloor,
        );
        r.scale = Some([1.0, 0.7]);
        assert_eq!(nearest_indices(&r, 5), [0, 2, 3]);
        r.scale = None;
        assert_eq!(nearest_indices(&r, 5), [0, 2, 4]);
    }

    #[test]
    fn bad_parameters_are_errors() {
        let r = Resize::nearest([0, 2], ResizeCoord::HalfPixel, NearestMode::Floor);
        assert!(r.out_shape(&[1, 2, 3, 4]).unwrap_err().contains("height"));
        let mut r = Resize::linear([2, 2], ResizeCoord::HalfPixel);
        assert!(r.out_shape(&[1, 2, 3]).unwrap_err().contains("4-D"));
        r.scale = Some([f32::NAN, 1.0]);
        assert!(r.out_shape(&[1, 2, 3, 4]).unwrap_err().contains("finite"));
        r.scale = None;
        assert_eq!(r.out_shape(&[1, 2, 3, 4]).unwrap(), [1, 2, 2, 2]);
    }
}

//! Gemma-4's expert blocks (26B-A4B layout) with their routed experts
//! streamed from disk, from Hugging Face's fused `experts.*` and from the
//! 4-bit `experts.switch_glu.*` our quantizer writes: the resident model's
//! logits bit for bit (`streamed_check`).

use spec_fixtures::gemma4::GATE_MOE;

use crate::batch_check::quantized;
use crate::streamed_check::check;

#[test]
fn streamed_gemma4_moe_equals_the_resident_model_bit_for_bit_fused_and_4_bits() {
    let spec = GATE_MOE.tiny(5, 8);
    let dir = tempfile::tempdir().expect("tempdir");
    spec.write(dir.path()).expect("fixture");
    let (experts, _, _) = spec.moe.expect("experts");
    let layers = spec.layer_types.len();
    check(dir.path(), layers, experts);
    let q4 = quantized(dir.path(), dir.path(), |m| m.ends_with("router.proj"));
    check(&q4, layers, experts);
}

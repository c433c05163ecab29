//! Which tensors get quantized and with which parameters: mlx-lm's rule
//! (`mlx_lm.utils.quantize_model`) applied to the tensors of the files.
//!
//! mlx-lm quantizes every module that has `to_quantized` (Linear, Embedding,
//! the MoE experts' SwitchLinear) whose weight's last dimension divides by
//! the group size, asking the model's or the caller's predicate last. In a
//! checkpoint those modules are the 2-D floating `*.weight` tensors (norms
//! and biases are 1-D) and the 3-D expert stacks under mlx-lm's
//! `switch_mlp` / `switch_glu` containers, or gpt-oss's `mlp.experts`
//! (other 3-D weights are convolutions, which mlx-lm does not quantize), so
//! the rule reads names, shapes and dtypes only.

use std::sync::Arc;

use mlx_rs::Dtype;

use super::QuantizeError;
use crate::config::QuantParams;

/// A predicate's answer for one module (given by its path, e.g.
/// `model.layers.0.mlp.down_proj`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleChoice {
    /// Quantize with the default parameters (if its shape allows).
    Quantize,
    /// Keep full precision; recorded as `false` in the `quantization` block.
    Exclude,
    /// Quantize with these parameters; recorded under the module's path.
    With(QuantParams),
    /// Quantize with these affine parameters; recorded under the module's
    /// path as mlx-lm's model files' predicates return them (group size
    /// and bits, no mode).
    Affine(QuantParams),
}

/// Decides per module path; see [`ModuleChoice`].
pub type ModulePredicate = Arc<dyn Fn(&str) -> ModuleChoice + Send + Sync>;

/// What happens to one tensor of the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Copied as it is.
    Keep,
    /// A quantizable weight the predicate excluded: copied, recorded `false`.
    Exclude { module: String },
    /// Replaced by `{module}.weight/scales` (and `biases` in affine mode); `custom` parameters are
    /// recorded under the module's path, with their mode where `names_mode`.
    Quantize {
        module: String,
        params: QuantParams,
        custom: bool,
        names_mode: bool,
    },
}

/// Fails unless MLX quantizes with `params` (its mode takes that group size
/// and bit width); `what` names the model or module in the error.
pub fn check_params(what: &str, params: QuantParams) -> Result<(), QuantizeError> {
    params
        .check()
        .map(|_| ())
        .map_err(|source| QuantizeError::UnsupportedParams {
            what: what.to_owned(),
            source,
        })
}

/// The decision for tensor `name` of `shape` and `dtype`, in mlx-lm's order:
/// a module that is not Linear/Embedding-shaped is kept; an excluded one is
/// recorded; one whose last dimension does not divide by the default group
/// size is kept silently, as mlx-lm keeps it.
pub(crate) fn decide(
    model_type: &str,
    name: &str,
    shape: &[i32],
    dtype: Dtype,
    defaults: QuantParams,
    predicate: Option<&ModulePredicate>,
) -> Result<Decision, QuantizeError> {
    let Some(module) = name.strip_suffix(".weight") else {
        return Ok(Decision::Keep);
    };
    if is_plain_parameter(model_type, module) {
        return Ok(Decision::Keep);
    }
    let floating = matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16);
    let experts = shape.len() == 3 && is_expert_stack(model_type, module);
    if !(shape.len() == 2 || experts) || !floating || module.is_empty() {
        return Ok(Decision::Keep);
    }
    let choice = predicate.map_or(ModuleChoice::Quantize, |p| p(module));
    if choice == ModuleChoice::Exclude {
        return Ok(Decision::Exclude {
            module: module.to_owned(),
        });
    }
    let columns = shape[shape.len() - 1];
    if columns % defaults.group_size != 0 {
        return Ok(Decision::Keep);
    }
    match choice {
        ModuleChoice::With(params) | ModuleChoice::Affine(params) => {
            check_params(module, params)?;
            if columns % params.group_size != 0 {
                return Err(QuantizeError::GroupSizeMismatch {
                    module: module.to_owned(),
                    columns,
                    group_size: params.group_size,
                });
            }
            Ok(Decision::Quantize {
                module: module.to_owned(),
                params,
                custom: true,
                names_mode: matches!(choice, ModuleChoice::With(_)),
            })
        }
        _ => Ok(Decision::Quantize {
            module: module.to_owned(),
            params: defaults,
            custom: false,
            names_mode: true,
        }),
    }
}

/// Whether `module` of a `model_type` checkpoint holds a weight that mlx-lm
/// declares as a plain parameter rather than a `Linear` (so
/// `nn.quantize` never touches it, whatever its shape): the MoE router of
/// the DeepSeek-style families (`MoEGate.weight` in `deepseek_v3.py` /
/// `deepseek_v32.py`, which `glm_moe_dsa` and `glm4_moe` build on).
fn is_plain_parameter(model_type: &str, module: &str) -> bool {
    matches!(
        model_type,
        "glm_moe_dsa" | "glm4_moe" | "deepseek_v3" | "deepseek_v32"
    ) && module.ends_with(".mlp.gate")
}

/// Whether the 3-D weight of `module` is a stack of experts (mlx-lm's
/// `SwitchLinear`): under a `switch_*` container, or gpt-oss's
/// `mlp.experts.*_proj`.
fn is_expert_stack(model_type: &str, module: &str) -> bool {
    module.split('.').any(|part| part.starts_with("switch_"))
        || (model_type == "gpt_oss" && module.contains(".mlp.experts."))
}

/// The predicate a model family's mlx-lm file declares (`quant_predicate`),
/// used when the caller gives none, as `mlx_lm.utils.quantize_model` does.
pub fn model_predicate(model_type: &str) -> Option<ModulePredicate> {
    match model_type {
        // mlx-lm's gemma4_text keeps its MoE router at 8 bits, group 64
        // (affine: its override names no mode, whatever the default's).
        "gemma4" | "gemma4_text" => Some(Arc::new(|module: &str| {
            if module.ends_with("router.proj") {
                ModuleChoice::Affine(QuantParams::affine(64, 8))
            } else {
                ModuleChoice::Quantize
            }
        })),
        // mlx-lm's Qwen MoE and gpt-oss files keep the router (and the Next / 3.5
        // shared expert's gate) at 8 bits, group 64, affine.
        "qwen3_moe" => Some(router_at_8_bits(&[".mlp.gate"])),
        "gpt_oss" => Some(router_at_8_bits(&[".mlp.router"])),
        "qwen3_next" | "qwen3_5" | "qwen3_5_moe" => {
            Some(router_at_8_bits(&[".mlp.gate", ".shared_expert_gate"]))
        }
        _ => None,
    }
}

/// Modules ending in one of `suffixes` at 8 bits, group 64 (affine);
/// the others at the defaults.
fn router_at_8_bits(suffixes: &'static [&'static str]) -> ModulePredicate {
    Arc::new(move |module: &str| {
        if suffixes.iter().any(|s| module.ends_with(s)) {
            ModuleChoice::Affine(QuantParams::affine(64, 8))
        } else {
            ModuleChoice::Quantize
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::QuantMode;

    const G64B4: QuantParams = QuantParams::affine(64, 4);

    fn check(
        name: &str,
        shape: &[i32],
        dtype: Dtype,
        predicate: Option<&ModulePredicate>,
        expected: Decision,
    ) {
        let got = decide("llama", name, shape, dtype, G64B4, predicate).expect("decide");
        assert_eq!(got, expected, "{name} {shape:?} {dtype:?}");
    }

    fn quantize(module: &str) -> Decision {
        Decision::Quantize {
            module: module.to_owned(),
            params: G64B4,
            custom: false,
            names_mode: true,
        }
    }

    #[test]
    fn only_two_dimensional_float_weights_dividing_by_the_group_are_quantized() {
        check(
            "model.layers.0.mlp.up_proj.weight",
            &[128, 64],
            Dtype::Float32,
            None,
            quantize("model.layers.0.mlp.up_proj"),
        );
        check(
            "model.embed_tokens.weight",
            &[320, 128],
            Dtype::Bfloat16,
            None,
            quantize("model.embed_tokens"),
        );
        check(
            "lm_head.weight",
            &[320, 64],
            Dtype::Float16,
            None,
            quantize("lm_head"),
        );
        check(
            "model.norm.weight",
            &[64],
            Dtype::Float32,
            None,
            Decision::Keep,
        );
        check(
            "model.layers.0.self_attn.q_proj.bias",
            &[64, 64],
            Dtype::Float32,
            None,
            Decision::Keep,
        );
        check(
            "model.conv.weight",
            &[64, 3, 64],
            Dtype::Float32,
            None,
            Decision::Keep,
        );
        check(
            "model.layers.1.mlp.switch_mlp.up_proj.weight",
            &[4, 128, 64],
            Dtype::Bfloat16,
            None,
            quantize("model.layers.1.mlp.switch_mlp.up_proj"),
        );
        check(
            "model.layers.1.experts.switch_glu.down_proj.weight",
            &[4, 64, 96],
            Dtype::Float32,
            None,
            Decision::Keep,
        );
        check(
            "model.layers.0.mlp.down_proj.weight",
            &[64, 96],
            Dtype::Float32,
            None,
            Decision::Keep,
        );
        check(
            "model.table.weight",
            &[64, 64],
            Dtype::Int32,
            None,
            Decision::Keep,
        );
    }

    #[test]
    fn predicate_excludes_and_overrides_per_module() {
        let p: ModulePredicate = Arc::new(|m: &str| match m {
            "lm_head" => ModuleChoice::Exclude,
            "model.layers.0.mlp.down_proj" => ModuleChoice::With(QuantParams::affine(32, 8)),
            _ => ModuleChoice::Quantize,
        });
        check(
            "lm_head.weight",
            &[320, 64],
            Dtype::Float32,
            Some(&p),
            Decision::Exclude {
                module: "lm_head".into(),
            },
        );
        // An exclusion is recorded even where the shape would keep it anyway.
        check(
            "lm_head.weight",
            &[320, 48],
            Dtype::Float32,
            Some(&p),
            Decision::Exclude {
                module: "lm_head".into(),
            },
        );
        check(
            "model.layers.0.mlp.down_proj.weight",
            &[64, 128],
            Dtype::Float32,
            Some(&p),
            Decision::Quantize {
                module: "model.layers.0.mlp.down_proj".into(),
                params: QuantParams::affine(32, 8),
                custom: true,
                names_mode: true,
            },
        );
        check(
            "model.layers.1.mlp.down_proj.weight",
            &[64, 128],
            Dtype::Float32,
            Some(&p),
            quantize("model.layers.1.mlp.down_proj"),
        );
    }

    #[test]
    fn bad_module_parameters_are_typed_errors() {
        let bad_bits: ModulePredicate =
            Arc::new(|_: &str| ModuleChoice::With(QuantParams::affine(64, 7)));
        let err = decide(
            "llama",
            "a.weight",
            &[8, 64],
            Dtype::Float32,
            G64B4,
            Some(&bad_bits),
        )
        .expect_err("7 bits");
        assert!(
            matches!(&err, QuantizeError::UnsupportedParams { what, .. } if what == "a"),
            "{err}"
        );
        assert!(err.to_string().contains("7 bits"), "{err}");
        let bad_mode: ModulePredicate = Arc::new(|_: &str| {
            ModuleChoice::With(QuantParams {
                mode: QuantMode::Mxfp8,
                group_size: 64,
                bits: 8,
            })
        });
        let err = decide(
            "llama",
            "a.weight",
            &[8, 64],
            Dtype::Float32,
            G64B4,
            Some(&bad_mode),
        )
        .expect_err("mxfp8 group 64");
        assert!(
            err.to_string()
                .contains("a: mxfp8 quantization does not take group size 64"),
            "{err}"
        );
        let bad_group: ModulePredicate =
            Arc::new(|_: &str| ModuleChoice::With(QuantParams::affine(128, 4)));
        let err = decide(
            "llama",
            "a.weight",
            &[8, 192],
            Dtype::Float32,
            G64B4,
            Some(&bad_group),
        )
        .expect_err("192 % 128");
        assert!(
            err.to_string().contains("192") && err.to_string().contains("`a`"),
            "{err}"
        );
        assert!(check_params("model", QuantParams::affine(48, 4)).is_err());
        assert!(check_params("model", QuantParams::affine(128, 3)).is_ok());
    }

    #[test]
    fn a_deepseek_style_router_is_never_quantized() {
        for model_type in ["glm_moe_dsa", "deepseek_v32"] {
            let got = decide(
                model_type,
                "model.layers.3.mlp.gate.weight",
                &[64, 128],
                Dtype::Float32,
                G64B4,
                None,
            )
            .expect("decide");
            assert_eq!(got, Decision::Keep, "{model_type}");
        }
        let expert = decide(
            "glm_moe_dsa",
            "model.layers.3.mlp.shared_experts.gate_proj.weight",
            &[64, 128],
            Dtype::Float32,
            G64B4,
            None,
        )
        .expect("decide");
        assert!(matches!(expert, Decision::Quantize { .. }), "{expert:?}");
    }

    #[test]
    fn gemma4_router_gets_mlx_lm_s_eight_bits() {
        let p = model_predicate("gemma4_text").expect("gemma4 has a rule");
        assert_eq!(
            p("model.layers.3.router.proj"),
            ModuleChoice::Affine(QuantParams::affine(64, 8))
        );
        assert_eq!(p("model.layers.3.mlp.up_proj"), ModuleChoice::Quantize);
        assert!(model_predicate("llama").is_none());
    }

    #[test]
    fn qwen_routers_and_shared_expert_gates_get_mlx_lm_s_eight_bits() {
        let eight = ModuleChoice::Affine(QuantParams::affine(64, 8));
        let moe = model_predicate("qwen3_moe").expect("qwen3_moe has a rule");
        assert_eq!(moe("model.layers.1.mlp.gate"), eight);
        assert_eq!(moe("model.layers.1.mlp.gate_proj"), ModuleChoice::Quantize);
        assert_eq!(
            moe("model.layers.1.mlp.switch_mlp.up_proj"),
            ModuleChoice::Quantize
        );
        let oss = model_predicate("gpt_oss").expect("gpt_oss has a rule");
        assert_eq!(oss("model.layers.0.mlp.router"), eight);
        assert_eq!(
            oss("model.layers.0.mlp.experts.up_proj"),
            ModuleChoice::Quantize
        );
        for model_type in ["qwen3_next", "qwen3_5", "qwen3_5_moe"] {
            let p = model_predicate(model_type).expect("a rule");
            assert_eq!(p("language_model.model.layers.0.mlp.gate"), eight);
            assert_eq!(p("model.layers.0.mlp.shared_expert_gate"), eight);
            assert_eq!(
                p("model.layers.0.mlp.shared_expert.gate_proj"),
                ModuleChoice::Quantize
            );
        }
    }
}

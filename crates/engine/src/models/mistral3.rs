//! `mistral3`: Mistral 3 (Ministral 3, Mistral Small 3.x, Devstral 2) dense models. Llama's
//! layer; the family reads YaRN's own keys (`rope.scaling.yarn_beta_fast`, `yarn_beta_slow`,
//! `yarn_log_multiplier`) and Llama 4's attention temperature (`attention.temperature_scale`):
//! after RoPE, queries at position `p` are multiplied by `ln(floor(p / n) + 1) * scale + 1`,
//! `n` being the original context length, so attention sharpens as the context grows past it.

use super::{Family, LayerTensors, pre_norm_layer};
use crate::blocks::Blocks;
use crate::config::{AttnTemperature, Hparams};
use crate::weights::LayerWeights;
use crate::{Error, ModelConfig, Result};

pub(crate) struct Mistral3;

impl Family for Mistral3 {
    fn configure(&self, hp: &Hparams<'_>, cfg: &mut ModelConfig) -> Result<()> {
        if let Some(y) = &mut cfg.yarn {
            if let Some(b) = hp.opt_f32("rope.scaling.yarn_beta_fast")? {
                y.beta.0 = hp.positive_f32("rope.scaling.yarn_beta_fast", b)?;
            }
            if let Some(b) = hp.opt_f32("rope.scaling.yarn_beta_slow")? {
                y.beta.1 = hp.positive_f32("rope.scaling.yarn_beta_slow", b)?;
            }
            if let Some(m) = hp.opt_f32("rope.scaling.yarn_log_multiplier")? {
                y.log_mul = if m == 0.0 {
                    0.0
                } else {
                    hp.positive_f32("rope.scaling.yarn_log_multiplier", m)?
                };
            }
        }
        if let Some(scale) = hp.opt_f32("attention.temperature_scale")?
            && scale != 0.0
        {
            if !scale.is_finite() {
                return Err(Error::InvalidModel(format!(
                    "{}.attention.temperature_scale is {scale}; it must be finite",
                    cfg.arch
                )));
            }
            if cfg.rope_ctx_orig == 0 {
                return Err(Error::InvalidModel(format!(
                    "{}.attention.temperature_scale needs a non-zero original context length",
                    cfg.arch
                )));
            }
            cfg.attn_temperature = Some(AttnTemperature {
                scale,
                floor_scale: cfg.rope_ctx_orig,
            });
        }
        Ok(())
    }

    fn tensors(&self) -> LayerTensors {
        LayerTensors::default()
    }

    fn layer(&self, b: &mut Blocks<'_, '_>, lw: &LayerWeights) -> Result<()> {
        pre_norm_layer(b, lw)
    }
}

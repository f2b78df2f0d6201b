//! The model zoo, built in Rust. Every model takes a batch size and an input size (image side,
//! or sequence length for the Transformer) and counts operators and edges the way IOS does:
//! the input placeholder is not an operator, a separable convolution (or relu + separable
//! convolution) is one `sequential` operator, and a concat is one operator.

use crate::error::{GraphError, Result};
use crate::graph::Graph;
use crate::names::{self, Known};
use crate::op::DType;

mod googlenet;
mod inception;
mod nasnet;
mod randwire;
mod resnet;
mod squeezenet;
mod transformer;

/// How to instantiate a zoo model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZooConfig {
    pub batch: usize,
    /// Image side (H = W) or sequence length; `None` takes the model's default.
    pub input_size: Option<usize>,
    pub dtype: DType,
}

impl Default for ZooConfig {
    fn default() -> Self {
        ZooConfig {
            batch: 1,
            input_size: None,
            dtype: DType::F32,
        }
    }
}

/// A zoo entry.
#[derive(Clone, Copy, Debug)]
pub struct ModelSpec {
    pub name: &'static str,
    /// Other names people may try (`bert`): never matched, only suggested in the error.
    pub hints: &'static [&'static str],
    pub description: &'static str,
    /// Default image side or sequence length.
    pub default_input_size: usize,
    build: fn(&ZooConfig, usize) -> Result<Graph>,
}

impl ModelSpec {
    /// Build the model.
    pub fn build(&self, cfg: &ZooConfig) -> Result<Graph> {
        if cfg.batch == 0 {
            return Err(GraphError::invalid(
                self.name,
                "batch size must be positive",
            ));
        }
        let size = cfg.input_size.unwrap_or(self.default_input_size);
        if size == 0 {
            return Err(GraphError::invalid(
                self.name,
                "input size must be positive",
            ));
        }
        (self.build)(cfg, size).map_err(|e| match e {
            GraphError::Shape { node, message } => GraphError::invalid(
                format!("{} at input size {size}", self.name),
                format!("node '{node}': {message}"),
            ),
            e => e,
        })
    }
}

const MODELS: &[ModelSpec] = &[
    ModelSpec {
        name: "inception_v3",
        hints: &[],
        description: "Inception-v3 (Szegedy et al. 2016), IOS's variant: no auxiliary head, global pool last",
        default_input_size: 299,
        build: inception::build,
    },
    ModelSpec {
        name: "squeezenet",
        hints: &[],
        description: "SqueezeNet 1.0 (Iandola et al. 2016) with IOS's fire modules",
        default_input_size: 224,
        build: squeezenet::build,
    },
    ModelSpec {
        name: "randwire",
        hints: &[],
        description: "RandWire-WS large (Xie et al. 2019): Watts-Strogatz stages of 16/32/32/32 nodes, fixed seed",
        default_input_size: 224,
        build: randwire::build,
    },
    ModelSpec {
        name: "nasnet",
        hints: &[],
        description: "NASNet-A large (Zoph et al. 2018), separable convs as sequential ops",
        default_input_size: 331,
        build: nasnet::build,
    },
    ModelSpec {
        name: "resnet50",
        hints: &[],
        description: "ResNet-50 (He et al. 2016), batch norm folded into convs",
        default_input_size: 224,
        build: resnet::build,
    },
    ModelSpec {
        name: "googlenet",
        hints: &["inception_v1"],
        description: "GoogLeNet / Inception-v1 (Szegedy et al. 2015) as in torchvision, no auxiliary heads",
        default_input_size: 224,
        build: googlenet::build,
    },
    ModelSpec {
        name: "transformer",
        hints: &["bert"],
        description: "BERT-base style Transformer encoder: 12 layers, hidden 768, 12 heads, FFN 3072",
        default_input_size: 128,
        build: transformer::build,
    },
];

/// All zoo models.
pub fn models() -> &'static [ModelSpec] {
    MODELS
}

/// The model named exactly `name`; a near miss is an error suggesting the closest names.
pub fn find(name: &str) -> Result<&'static ModelSpec> {
    names::lookup("model", name, MODELS, |m| Known {
        name: m.name,
        hints: m.hints,
    })
    .map_err(GraphError::UnknownModel)
}

/// Build a zoo model by name.
pub fn build(name: &str, cfg: &ZooConfig) -> Result<Graph> {
    find(name)?.build(cfg)
}

//! The CNN models of the zoo: Inception-v3 and SqueezeNet (IOS's definitions), GoogLeNet and
//! ResNet-50 (torchvision's). Every expected number below is derived by hand or from a
//! published count (see the comments), never from the code under test.

use opsched_graph::zoo::{build, ZooConfig};
use opsched_graph::{summarize, DType, Graph, Op};

fn cfg(batch: usize, size: Option<usize>) -> ZooConfig {
    ZooConfig {
        batch,
        input_size: size,
        dtype: DType::F32,
    }
}

fn model(name: &str, batch: usize, size: Option<usize>) -> Graph {
    match build(name, &cfg(batch, size)) {
        Ok(g) => g,
        Err(e) => panic!("{name} (batch {batch}, size {size:?}) failed to build: {e}"),
    }
}

fn shape_of(g: &Graph, name: &str) -> Vec<usize> {
    match g.find(name) {
        Some(id) => g.node(id).shape.clone(),
        None => panic!("{}: no node named '{name}'", g.name),
    }
}

fn last_shape(g: &Graph) -> Vec<usize> {
    match g.ops().last() {
        Some(id) => g.node(id).shape.clone(),
        None => panic!("{}: no operators", g.name),
    }
}

fn block_names(g: &Graph) -> Vec<String> {
    g.blocks().iter().map(|b| b.name.clone()).collect()
}

/// Every operator lies in exactly one block (schedulers solve blocks separately).
fn assert_blocks_cover_all_ops(g: &Graph) {
    let mut owner = vec![0usize; g.len()];
    for b in g.blocks() {
        assert!(!b.nodes.is_empty(), "{}: empty block {}", g.name, b.name);
        for n in &b.nodes {
            owner[n.index()] += 1;
        }
    }
    for id in g.ops() {
        assert_eq!(
            owner[id.index()],
            1,
            "{}: op '{}' is in {} blocks",
            g.name,
            g.node(id).name,
            owner[id.index()]
        );
    }
    for id in g.inputs() {
        assert_eq!(
            owner[id.index()],
            0,
            "{}: the input lies in a block",
            g.name
        );
    }
}

const MODELS: [&str; 4] = ["inception_v3", "squeezenet", "googlenet", "resnet50"];

// ---------------------------------------------------------------------------------------------
// Operator and edge counts (derivations in the module docs of each zoo file, summarized here).
// ---------------------------------------------------------------------------------------------

#[test]
fn inception_v3_counts_match_ios() {
    // IOS paper / IOS's inception_v3.py: 119 operators, 153 edges.
    // ops:   stem 7 + 3 * A 9 + B 6 + 4 * C 12 + D 8 + 2 * E 11 + logits 1 = 119
    // edges: stem 6 + 3 * 12 + 8 + 4 * 15 + 10 + 2 * 16 + 1 = 153
    let g = model("inception_v3", 1, None);
    assert_eq!(g.op_count(), 119);
    assert_eq!(g.edge_count(), 153);
    let s = summarize(&g);
    assert_eq!(s.ops, 119);
    assert_eq!(s.edges, 153);
    // 94 convs, 4 max pools (2 stem + B + D), 9 avg pools (A, C, E), 1 global pool, 11 concats.
    assert_eq!(s.op_types.get("conv2d"), Some(&94));
    assert_eq!(s.op_types.get("pool2d"), Some(&14));
    assert_eq!(s.op_types.get("concat"), Some(&11));
}

#[test]
fn squeezenet_counts_match_ios() {
    // IOS's squeezenet.py: 50 operators, 65 edges (derivation in zoo/squeezenet.rs):
    // ops 2 + (6+5+6) + 1 + (5+6+5+6) + 1 + 5 + 2, edges 1 + (8+7+8) + 1 + (7+8+7+8) + 1 + 7 + 2.
    let g = model("squeezenet", 1, None);
    assert_eq!(g.op_count(), 50);
    assert_eq!(g.edge_count(), 65);
    // 8 fires * 3 convs + 4 bypass projections + stem conv + final conv = 30 convs;
    // 3 max pools + 1 global pool; 8 concats and 8 sums (identity with one summed term).
    let s = summarize(&g);
    assert_eq!(s.op_types.get("conv2d"), Some(&30));
    assert_eq!(s.op_types.get("pool2d"), Some(&4));
    assert_eq!(s.op_types.get("concat"), Some(&8));
    assert_eq!(s.op_types.get("identity"), Some(&8));
    // The first fire changes 96 -> 128 channels and needs a projection; the second does not.
    assert!(g.find("fire2.bypass").is_some());
    assert!(g.find("fire3.bypass").is_none());
}

#[test]
fn googlenet_counts() {
    // stem 5 ops (4 edges); 9 modules * (6 convs + maxpool + concat) = 72 ops, 9 * 11 edges
    // (4 out of the module input, 3 inside branches, 4 into the concat); maxpool3/4: 2 ops,
    // 2 edges in; head avgpool + reshape + linear: 3 ops, 3 edges.
    // ops = 5 + 72 + 2 + 3 = 82, edges = 4 + 99 + 2 + 3 = 108.
    let g = model("googlenet", 1, None);
    assert_eq!(g.op_count(), 82);
    assert_eq!(g.edge_count(), 108);
    let s = summarize(&g);
    assert_eq!(s.op_types.get("conv2d"), Some(&(3 + 9 * 6)));
    assert_eq!(s.op_types.get("linear"), Some(&1));
}

#[test]
fn resnet50_counts() {
    // stem 2 ops (1 edge); 12 plain bottlenecks * 5 ops (6 edges); 4 downsampling ones * 6 ops
    // (7 edges); head 3 ops (3 edges). ops = 2 + 60 + 24 + 3 = 89; edges = 1 + 72 + 28 + 3 = 104.
    let g = model("resnet50", 1, None);
    assert_eq!(g.op_count(), 89);
    assert_eq!(g.edge_count(), 104);
    let s = summarize(&g);
    // 1 + 16 * 3 + 4 convs; 16 adds and 16 standalone relus.
    assert_eq!(s.op_types.get("conv2d"), Some(&53));
    assert_eq!(s.op_types.get("elementwise"), Some(&16));
    assert_eq!(s.op_types.get("activation"), Some(&16));
}

// ---------------------------------------------------------------------------------------------
// Shapes.
// ---------------------------------------------------------------------------------------------

#[test]
fn output_shapes() {
    let g = model("inception_v3", 1, None);
    assert_eq!(last_shape(&g), vec![1, 2048, 1, 1]);
    let g = model("squeezenet", 1, None);
    assert_eq!(last_shape(&g), vec![1, 1000, 1, 1]);
    let g = model("googlenet", 1, None);
    assert_eq!(last_shape(&g), vec![1, 1000]);
    let g = model("resnet50", 1, None);
    assert_eq!(last_shape(&g), vec![1, 1000]);
}

#[test]
fn inception_v3_intermediate_shapes() {
    let g = model("inception_v3", 1, None);
    // 299 -(3x3/2)-> 149 -(3x3)-> 147 -(3x3 p1)-> 147 -(pool 3/2)-> 73 -> 73 -(3x3)-> 71 -> 35
    assert_eq!(shape_of(&g, "stem.pool2"), vec![1, 192, 35, 35]);
    // A: 64 + 64 + 96 + pool_features.
    assert_eq!(shape_of(&g, "a1.concat"), vec![1, 256, 35, 35]);
    assert_eq!(shape_of(&g, "a3.concat"), vec![1, 288, 35, 35]);
    // B: 384 + 96 + 288 at (35 - 3) / 2 + 1 = 17.
    assert_eq!(shape_of(&g, "b.concat"), vec![1, 768, 17, 17]);
    assert_eq!(shape_of(&g, "c4.concat"), vec![1, 768, 17, 17]);
    // D: 320 + 192 + 768 at (17 - 3) / 2 + 1 = 8.
    assert_eq!(shape_of(&g, "d.concat"), vec![1, 1280, 8, 8]);
    // E: 320 + 2 * 384 + 2 * 384 + 192.
    assert_eq!(shape_of(&g, "e2.concat"), vec![1, 2048, 8, 8]);
    assert_eq!(shape_of(&g, "a1.branch5x5_2"), vec![1, 64, 35, 35]);
    assert_eq!(
        block_names(&g),
        ["stem", "a1", "a2", "a3", "b", "c1", "c2", "c3", "c4", "d", "e1", "e2", "logits"]
    );
    assert_eq!(g.blocks()[0].nodes.len(), 7);
    assert_eq!(g.blocks()[12].nodes.len(), 1);
    assert_blocks_cover_all_ops(&g);
}

#[test]
fn squeezenet_intermediate_shapes() {
    let g = model("squeezenet", 1, None);
    // IOS pads the 7x7/2 conv by 3: 224 -> 112, pool 3/2 -> 55, pool -> 27, pool -> 13.
    assert_eq!(shape_of(&g, "front.pool"), vec![1, 96, 55, 55]);
    assert_eq!(shape_of(&g, "fire4.sum"), vec![1, 256, 55, 55]);
    assert_eq!(shape_of(&g, "fire8.sum"), vec![1, 512, 27, 27]);
    assert_eq!(shape_of(&g, "fire9.sum"), vec![1, 512, 13, 13]);
    assert_eq!(block_names(&g).len(), 12); // as IOS: front, 8 fires, 2 pools, tail
    assert_blocks_cover_all_ops(&g);
}

#[test]
fn googlenet_intermediate_shapes() {
    let g = model("googlenet", 1, None);
    // 224 -(7x7/2 p3)-> 112 -(max 3/2 ceil)-> 56 -> 56 -(max 3/2 ceil)-> 28
    assert_eq!(shape_of(&g, "stem.maxpool2"), vec![1, 192, 28, 28]);
    assert_eq!(shape_of(&g, "inception3a.concat"), vec![1, 256, 28, 28]);
    // 28 -(max 3/2 ceil)-> 14; without ceil_mode it would be 13.
    assert_eq!(shape_of(&g, "maxpool3"), vec![1, 480, 14, 14]);
    assert_eq!(shape_of(&g, "inception4e.concat"), vec![1, 832, 14, 14]);
    assert_eq!(shape_of(&g, "maxpool4"), vec![1, 832, 7, 7]);
    assert_eq!(shape_of(&g, "inception5b.concat"), vec![1, 1024, 7, 7]);
    assert_eq!(shape_of(&g, "head.flatten"), vec![1, 1024]);
    // torchvision's "5x5" branch is a 3x3 conv.
    let id = g.find("inception3a.branch3_2").expect("branch3_2 exists");
    match &g.node(id).op {
        Op::Conv2d(c) => assert_eq!(c.kernel, [3, 3]),
        op => panic!("unexpected op {op:?}"),
    }
    assert_eq!(block_names(&g).len(), 1 + 9 + 2 + 1);
    assert_blocks_cover_all_ops(&g);
}

#[test]
fn resnet50_intermediate_shapes() {
    let g = model("resnet50", 1, None);
    assert_eq!(shape_of(&g, "stem.maxpool"), vec![1, 64, 56, 56]);
    assert_eq!(shape_of(&g, "layer1.2.relu"), vec![1, 256, 56, 56]);
    // v1.5: the stride sits on the 3x3 conv, the 1x1 before it keeps the resolution.
    assert_eq!(shape_of(&g, "layer2.0.conv1"), vec![1, 128, 56, 56]);
    assert_eq!(shape_of(&g, "layer2.0.conv2"), vec![1, 128, 28, 28]);
    assert_eq!(shape_of(&g, "layer3.5.relu"), vec![1, 1024, 14, 14]);
    assert_eq!(shape_of(&g, "layer4.2.relu"), vec![1, 2048, 7, 7]);
    assert!(g.find("layer3.0.downsample").is_some());
    assert!(g.find("layer3.1.downsample").is_none());
    assert_eq!(block_names(&g).len(), 1 + 16 + 1);
    assert_blocks_cover_all_ops(&g);
}

// ---------------------------------------------------------------------------------------------
// Parameters and FLOPs.
// ---------------------------------------------------------------------------------------------

#[test]
fn parameter_counts_match_published_models_with_batch_norm_folded() {
    // Folding batch norm replaces its 2 parameters per channel (weight, bias) by 1 conv bias.
    //
    // ResNet-50: torchvision reports 25,557,032 parameters; its BN layers have
    // 64 + (3*384 + 256) + (4*768 + 512) + (6*1536 + 1024) + (3*3072 + 2048) = 26,560 channels.
    let resnet = summarize(&model("resnet50", 1, None)).params;
    assert_eq!(resnet, 25_557_032 - 26_560);

    // GoogLeNet: torchvision (aux_logits=False) reports 6,624,904; BN channels: stem 320 +
    // modules 368 + 640 + 624 + 648 + 664 + 704 + 1024 + 1024 + 1264 = 7,280.
    let googlenet = summarize(&model("googlenet", 1, None)).params;
    assert_eq!(googlenet, 6_624_904 - 7_280);

    // Inception-v3: torchvision reports 27,161,264 with the aux head (3,326,696) and the fc
    // (2,049,000), which IOS drops; BN channels: stem 400 + A 1,456 + B 640 + C 6,912 + D 1,280
    // + E 6,528 = 17,216.
    let inception = summarize(&model("inception_v3", 1, None)).params;
    assert_eq!(inception, 27_161_264 - 3_326_696 - 2_049_000 - 17_216);
    assert!((21_700_000..21_900_000).contains(&inception));

    // SqueezeNet: torchvision's squeezenet1_0 has 1,248,424 (biases, no BN); IOS's fire
    // modules add four bypass projections 96->128, 128->256, 256->384, 384->512 with biases.
    let bypass = (96 * 128 + 128) + (128 * 256 + 256) + (256 * 384 + 384) + (384 * 512 + 512);
    let squeezenet = summarize(&model("squeezenet", 1, None)).params;
    assert_eq!(squeezenet, 1_248_424 + bypass);
}

#[test]
fn flops_are_in_the_published_ranges() {
    // FLOPs count a multiply-add as 2, plus bias, activation, pooling and add work (< 1%).
    // ResNet-50: 4.09 GMACs at 224 -> ~8.2 GFLOPs.
    let f = summarize(&model("resnet50", 1, None)).flops as f64 / 1e9;
    assert!((8.1..8.4).contains(&f), "resnet50 {f} GFLOPs");
    // Inception-v3 at 299: 5.71 GMACs -> ~11.4 GFLOPs.
    let f = summarize(&model("inception_v3", 1, None)).flops as f64 / 1e9;
    assert!((11.2..11.7).contains(&f), "inception_v3 {f} GFLOPs");
    // GoogLeNet: 1.50 GMACs -> ~3.0 GFLOPs.
    let f = summarize(&model("googlenet", 1, None)).flops as f64 / 1e9;
    assert!((2.9..3.15).contains(&f), "googlenet {f} GFLOPs");
    // SqueezeNet 1.0: 0.82 GMACs in torchvision (109x109 after conv1). IOS's padded conv1 gives
    // 112x112 (x1.04 on everything after it) and the bypass projections add
    // 55^2 * (96*128 + 128*256) + 27^2 * (256*384 + 384*512) = 0.35 GMACs: ~1.2 GMACs, ~2.4 GFLOPs.
    let f = summarize(&model("squeezenet", 1, None)).flops as f64 / 1e9;
    assert!((2.2..2.6).contains(&f), "squeezenet {f} GFLOPs");
}

#[test]
fn resnet_stem_conv_flops_by_hand() {
    let g = model("resnet50", 1, None);
    let id = g.find("stem.conv1").expect("stem conv");
    let st = g.stats(id);
    // 64 x 112 x 112 outputs, each 3 * 7 * 7 MACs, plus one bias add and one relu each.
    let outs: u64 = 64 * 112 * 112;
    assert_eq!(st.flops, outs * 2 * 147 + outs + outs);
    assert_eq!(st.params, 64 * 147 + 64);
    // The classifier: 2048 x 1000 weights + 1000 biases.
    let fc = g.find("head.fc").expect("fc");
    assert_eq!(g.stats(fc).params, 2048 * 1000 + 1000);
}

#[test]
fn batch_16_scales_inputs_and_flops() {
    for name in MODELS {
        let one = model(name, 1, None);
        let many = model(name, 16, None);
        let (s1, s16) = (summarize(&one), summarize(&many));
        assert_eq!(s1.input_shapes.len(), 1, "{name}");
        let mut want = s1.input_shapes[0].clone();
        assert_eq!(want[0], 1, "{name}");
        want[0] = 16;
        assert_eq!(s16.input_shapes, vec![want], "{name}");
        assert_eq!(s16.flops, 16 * s1.flops, "{name}");
        assert_eq!(s16.params, s1.params, "{name}");
        assert_eq!((s16.ops, s16.edges), (s1.ops, s1.edges), "{name}");
        let mut last = last_shape(&one);
        last[0] = 16;
        assert_eq!(last_shape(&many), last, "{name}");
    }
}

#[test]
fn every_model_names_its_input_and_keeps_dtype() {
    for name in MODELS {
        let g = match build(
            name,
            &ZooConfig {
                batch: 2,
                input_size: None,
                dtype: DType::F16,
            },
        ) {
            Ok(g) => g,
            Err(e) => panic!("{name}: {e}"),
        };
        assert_eq!(g.dtype, DType::F16, "{name}");
        let inputs: Vec<_> = g.inputs().collect();
        assert_eq!(inputs.len(), 1, "{name}");
        assert_eq!(g.node(inputs[0]).name, "input", "{name}");
        assert_eq!(g.node(inputs[0]).shape[..2], [2, 3], "{name}");
    }
}

// ---------------------------------------------------------------------------------------------
// Input sizes.
// ---------------------------------------------------------------------------------------------

#[test]
fn inception_builds_at_512() {
    let g = model("inception_v3", 1, Some(512));
    assert_eq!((g.op_count(), g.edge_count()), (119, 153));
    // 512 -> 255 -> 253 -> 253 -> 126 -> 126 -> 124 -> 61; B: 30; D: 14.
    assert_eq!(shape_of(&g, "stem.pool2"), vec![1, 192, 61, 61]);
    assert_eq!(shape_of(&g, "b.concat"), vec![1, 768, 30, 30]);
    assert_eq!(shape_of(&g, "e2.concat"), vec![1, 2048, 14, 14]);
    assert_eq!(last_shape(&g), vec![1, 2048, 1, 1]);
    // More pixels, more work.
    let f299 = summarize(&model("inception_v3", 1, None)).flops;
    assert!(summarize(&g).flops > 2 * f299);
}

#[test]
fn other_sizes_build() {
    // GoogLeNet at 299: conv 150, maxpool1 75 (ceil: floor would give 74), maxpool2 37,
    // maxpool3 18, maxpool4 9.
    let g = model("googlenet", 1, Some(299));
    assert_eq!(shape_of(&g, "stem.maxpool1"), vec![1, 64, 75, 75]);
    assert_eq!(shape_of(&g, "inception5b.concat"), vec![1, 1024, 9, 9]);
    assert_eq!(last_shape(&g), vec![1, 1000]);
    let g = model("resnet50", 2, Some(256));
    assert_eq!(shape_of(&g, "layer4.2.relu"), vec![2, 2048, 8, 8]);
    let g = model("squeezenet", 1, Some(256));
    // 256 -> 128 -> 63 -> 31 -> 15.
    assert_eq!(shape_of(&g, "fire9.sum"), vec![1, 512, 15, 15]);
    // ResNet-50 is well defined down to tiny inputs (every stride-2 layer is padded):
    // 8 -> 4 -> 2 -> 2 -> 1 -> 1 -> 1.
    let g = model("resnet50", 1, Some(8));
    assert_eq!(shape_of(&g, "layer4.2.relu"), vec![1, 2048, 1, 1]);
}

#[test]
fn too_small_inputs_are_errors_not_panics() {
    // Inception at 8: 3 -> 1 -> 1, then a 3x3 max pool cannot fit.
    // GoogLeNet at 8: 4 -> 2 -> 2, then maxpool2 (3x3) cannot fit.
    // SqueezeNet at 8: 4 -> 1, then pool4 (3x3) cannot fit.
    for name in ["inception_v3", "googlenet", "squeezenet"] {
        match build(name, &cfg(1, Some(8))) {
            Ok(_) => panic!("{name} built at 8x8"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("input size 8"), "{name}: {msg}");
            }
        }
    }
    // Inception's smallest valid input: the stem needs 75 (-> 37 -> 35 -> 35 -> 17 -> 17 -> 15
    // -> 7), B then gives 3 and D 1.
    assert!(build("inception_v3", &cfg(1, Some(75))).is_ok());
    assert!(build("inception_v3", &cfg(1, Some(74))).is_err());
    for name in MODELS {
        assert!(build(name, &cfg(1, Some(0))).is_err(), "{name} at size 0");
        assert!(build(name, &cfg(0, None)).is_err(), "{name} at batch 0");
    }
}

//! Dispatch from protocol specs to rules, slots, and dtype round trips.
#![allow(clippy::float_cmp)] // the values compared are exact in binary

use super::*;

fn spec(kind: pb::optimizer_spec::Kind, lr: f64) -> pb::OptimizerSpec {
    pb::OptimizerSpec {
        kind: kind as i32,
        learning_rate: Some(pb::LearningRateSchedule {
            kind: pb::learning_rate_schedule::Kind::Constant as i32,
            initial: lr,
            ..Default::default()
        }),
        beta_1: 0.9,
        beta_2: 0.999,
        epsilon: 1e-7,
        rho: 0.9,
        ..Default::default()
    }
}

fn le32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn de32(bytes: &[u8]) -> Vec<f32> {
    f32::decode(bytes)
}

#[test]
fn specs_become_rules_with_their_slots() {
    use pb::optimizer_spec::Kind;
    let sgd = Optimizer::from_pb(Some(&spec(Kind::Sgd, 0.1))).unwrap();
    assert!(sgd.slots().is_empty());
    let mut with_momentum = spec(Kind::Sgd, 0.1);
    with_momentum.momentum = 0.9;
    let names = |o: &Optimizer| o.slots().iter().map(|s| s.0).collect::<Vec<_>>();
    assert_eq!(
        names(&Optimizer::from_pb(Some(&with_momentum)).unwrap()),
        ["momentum"]
    );
    assert_eq!(
        names(&Optimizer::from_pb(Some(&spec(Kind::Adam, 0.1))).unwrap()),
        ["m", "v"]
    );
    let mut rms = spec(Kind::Rmsprop, 0.1);
    rms.centered = true;
    rms.momentum = 0.5;
    assert_eq!(
        names(&Optimizer::from_pb(Some(&rms)).unwrap()),
        ["velocity", "average_gradient", "momentum"]
    );
    let mut ada = spec(Kind::Adagrad, 0.1);
    ada.initial_accumulator_value = 0.1;
    assert_eq!(
        Optimizer::from_pb(Some(&ada)).unwrap().slots(),
        [("accumulator", 0.1)]
    );
    // Every rule keeps its weight decay (Keras's `weight_decay=` on every optimizer);
    // AMSGrad adds a slot.
    let mut adam = spec(Kind::Adam, 0.1);
    adam.weight_decay = 0.5;
    assert_eq!(Optimizer::from_pb(Some(&adam)).unwrap().weight_decay, 0.5);
    adam.amsgrad = true;
    assert_eq!(
        names(&Optimizer::from_pb(Some(&adam)).unwrap()),
        ["m", "v", "v_max"]
    );
    let mut sgd = spec(Kind::Sgd, 0.1);
    sgd.weight_decay = 0.25;
    assert_eq!(Optimizer::from_pb(Some(&sgd)).unwrap().weight_decay, 0.25);
}

#[test]
fn weight_decay_comes_first_from_the_parameter_before_the_step() {
    use pb::optimizer_spec::Kind;
    // SGD with momentum, Keras's order: p -= lr * wd * p, then the momentum step on the
    // gradient alone (the decay does not enter the trace).
    let mut with = spec(Kind::Sgd, 0.1);
    with.momentum = 0.9;
    with.weight_decay = 0.5;
    let o = Optimizer::from_pb(Some(&with)).unwrap();
    let mut p = 2.0f64.to_le_bytes();
    let mut trace = 0.0f64.to_le_bytes();
    o.apply(
        DType::F64,
        0,
        &mut p,
        &1.0f64.to_le_bytes(),
        &mut [&mut trace],
    );
    // decay: 2 - 0.1 * 0.5 * 2 = 1.9; trace = g = 1 (optax's sgd); p = 1.9 - 0.1 * 1.
    let p = f64::from_le_bytes(p);
    assert!((p - 1.8).abs() < 1e-12, "{p}");
    assert!((f64::from_le_bytes(trace) - 1.0).abs() < 1e-12);
    for bad in [-0.1, f64::NAN, f64::INFINITY] {
        let mut spec = spec(Kind::Adam, 0.1);
        spec.weight_decay = bad;
        let refused = Optimizer::from_pb(Some(&spec)).unwrap_err();
        assert!(refused.contains("weight_decay"), "{refused}");
    }
}

#[test]
fn bad_specs_are_refused_with_reasons() {
    use pb::optimizer_spec::Kind;
    assert!(Optimizer::from_pb(None)
        .unwrap_err()
        .contains("no optimizer"));
    let e = Optimizer::from_pb(Some(&spec(Kind::Unspecified, 0.1))).unwrap_err();
    assert!(e.contains("unknown"), "{e}");
    let mut no_rate = spec(Kind::Sgd, 0.1);
    no_rate.learning_rate = None;
    assert!(Optimizer::from_pb(Some(&no_rate))
        .unwrap_err()
        .contains("learning_rate"));
    let mut bad = spec(Kind::Sgd, 0.1);
    bad.momentum = 1.5;
    assert!(Optimizer::from_pb(Some(&bad))
        .unwrap_err()
        .contains("momentum"));
}

#[test]
fn float32_bytes_are_updated_in_place() {
    let opt = Optimizer::from_pb(Some(&spec(pb::optimizer_spec::Kind::Sgd, 0.5))).unwrap();
    let mut param = le32(&[1.0, 2.0]);
    opt.apply(DType::F32, 0, &mut param, &le32(&[2.0, -2.0]), &mut []);
    assert_eq!(de32(&param), [0.0, 3.0]);
}

#[test]
fn half_precision_computes_through_float32() {
    let opt = Optimizer::from_pb(Some(&spec(pb::optimizer_spec::Kind::Adagrad, 1.0))).unwrap();
    let mut param: Vec<u8> = bf16::from_f32(1.0).to_le_bytes().to_vec();
    let grad = bf16::from_f32(2.0).to_le_bytes();
    let mut acc: Vec<u8> = bf16::from_f32(0.0).to_le_bytes().to_vec();
    opt.apply(DType::BF16, 0, &mut param, &grad, &mut [&mut acc]);
    let p = bf16::from_le_bytes([param[0], param[1]]).to_f32();
    assert!((p - 0.0).abs() < 1e-2, "{p}");
    assert_eq!(bf16::from_le_bytes([acc[0], acc[1]]).to_f32(), 4.0);
    let mut half: Vec<u8> = f16::from_f32(1.0).to_le_bytes().to_vec();
    let sgd = Optimizer::from_pb(Some(&spec(pb::optimizer_spec::Kind::Sgd, 0.25))).unwrap();
    sgd.apply(
        DType::F16,
        0,
        &mut half,
        &f16::from_f32(2.0).to_le_bytes(),
        &mut [],
    );
    assert_eq!(f16::from_le_bytes([half[0], half[1]]).to_f32(), 0.5);
}

#[test]
fn the_schedule_is_read_at_the_count_before_this_update() {
    let mut s = spec(pb::optimizer_spec::Kind::Sgd, 0.0);
    s.learning_rate = Some(pb::LearningRateSchedule {
        kind: pb::learning_rate_schedule::Kind::PiecewiseConstant as i32,
        boundaries: vec![0],
        values: vec![1.0, 0.5],
        ..Default::default()
    });
    let opt = Optimizer::from_pb(Some(&s)).unwrap();
    let mut param = le32(&[0.0]);
    opt.apply(DType::F32, 0, &mut param, &le32(&[1.0]), &mut []);
    opt.apply(DType::F32, 1, &mut param, &le32(&[1.0]), &mut []);
    assert_eq!(de32(&param), [-1.5]);
}

#[test]
fn adam_bias_correction_follows_the_count() {
    let opt = Optimizer::from_pb(Some(&spec(pb::optimizer_spec::Kind::Adam, 0.1))).unwrap();
    let mut param = le32(&[0.0]);
    let (mut m, mut v) = (le32(&[0.0]), le32(&[0.0]));
    opt.apply(
        DType::F32,
        0,
        &mut param,
        &le32(&[4.0]),
        &mut [&mut m, &mut v],
    );
    // First step: -lr * g / (|g| + eps) with the count 1 bias correction.
    let p = de32(&param)[0];
    assert!((p + 0.1).abs() < 1e-6, "{p}");
}

#[test]
fn compressed_gradients_widen_as_if_whole() {
    // SGD at rate 1 from zero leaves minus the widened gradient in the variable.
    let sgd = Optimizer::from_pb(Some(&spec(pb::optimizer_spec::Kind::Sgd, 1.0))).unwrap();
    let q = [127i8 as u8, (-64i8) as u8, 0];
    let mut param = le32(&[0.0; 3]);
    let int8 = Gradient::new(&q, DType::I8, 0.5, DType::F32).unwrap();
    sgd.apply_gradient(DType::F32, 0, &mut param, &int8, &mut []);
    assert_eq!(de32(&param), [-63.5, 32.0, 0.0]);
    let b: Vec<u8> = [bf16::from_f32(-2.5), bf16::from_f32(0.25)]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut param = le32(&[0.0; 2]);
    let widened = Gradient::new(&b, DType::BF16, 0.0, DType::F32).unwrap();
    sgd.apply_gradient(DType::F32, 0, &mut param, &widened, &mut []);
    assert_eq!(de32(&param), [2.5, -0.25]);
    // Into a float16 variable: int8 * scale rounded to float16 first.
    let mut half_param = vec![0u8; 2];
    let third = Gradient::new(&[1], DType::I8, 1.0 / 3.0, DType::F16).unwrap();
    sgd.apply_gradient(DType::F16, 0, &mut half_param, &third, &mut []);
    let got = f16::from_le_bytes([half_param[0], half_param[1]]);
    assert_eq!(got, -f16::from_f64(1.0 / 3.0));
}

#[test]
fn a_large_variable_stepped_in_parts_matches_one_pass() {
    let n = 3 * PART_ELEMENTS + 123;
    let values: Vec<f32> = (0..n)
        .map(|i| f32::from(((i * 7919) % 1000) as u16) / 500.0 - 1.0)
        .collect();
    let grad = le32(&values.iter().map(|v| v * 0.5 + 0.1).collect::<Vec<_>>());
    let adam = Optimizer::from_pb(Some(&spec(pb::optimizer_spec::Kind::Adam, 0.01))).unwrap();
    let (mut p1, mut m1, mut v1) = (le32(&values), le32(&values), le32(&vec![0.5; n]));
    let (mut p2, mut m2, mut v2) = (p1.clone(), m1.clone(), v1.clone());
    let g = Gradient::Same(&grad);
    for done in 0..2 {
        adam.apply_gradient(DType::F32, done, &mut p1, &g, &mut [&mut m1, &mut v1]);
        adam.apply_range::<f32, f32>(done, &mut p2, &g, &mut [&mut m2, &mut v2]);
    }
    assert!(p1 == p2 && m1 == m2 && v1 == v2);
    assert_ne!(p1, le32(&values));
}

/// Every rule, in float32 and float64, with a gradient as sent and compressed: stepping
/// typed memory in place gives the bits of stepping through scratch buffers, and memory
/// that is not aligned for the type takes the scratch path.
#[test]
fn in_place_and_decoded_updates_are_the_same_bits() {
    use pb::optimizer_spec::Kind;
    fn run<S: Stored<T>, T: Real>(o: &Optimizer, bytes: &[u8], grad: &Gradient<'_>) {
        let n = bytes.len();
        let slots = o.slots().len();
        // One byte of room so that a copy can sit one byte off its alignment.
        let mut typed: Vec<Vec<u8>> = (0..=slots).map(|_| bytes.to_vec()).collect();
        let mut decoded = typed.clone();
        let mut shifted: Vec<Vec<u8>> = (0..=slots).map(|_| [&[0u8][..], bytes].concat()).collect();
        assert!(S::typed(&mut typed[0]).is_some());
        assert!(S::typed(&mut shifted[0][1..]).is_none());
        for done in 0..3 {
            let (p, s) = typed.split_first_mut().unwrap();
            let mut s: Vec<&mut [u8]> = s.iter_mut().map(Vec::as_mut_slice).collect();
            o.apply_range::<S, T>(done, p, grad, &mut s);
            let (p, s) = decoded.split_first_mut().unwrap();
            let mut s: Vec<&mut [u8]> = s.iter_mut().map(Vec::as_mut_slice).collect();
            o.apply_decoded::<S, T>(done, p, grad, &mut s);
            let (p, s) = shifted.split_first_mut().unwrap();
            let mut s: Vec<&mut [u8]> = s.iter_mut().map(|b| &mut b[1..]).collect();
            o.apply_range::<S, T>(done, &mut p[1..], grad, &mut s);
        }
        for ((t, d), s) in typed.iter().zip(&decoded).zip(&shifted) {
            assert_eq!(t, d, "{:?}", o.rule);
            assert_eq!(&t[..], &s[1..=n], "{:?}", o.rule);
        }
        assert_ne!(typed[0], bytes, "{:?}", o.rule);
    }
    let n = 3 * CHUNK + 5;
    let values: Vec<f64> = (0..n)
        .map(|i| f64::from(((i * 7919) % 1000) as u16) / 500.0 - 1.0)
        .collect();
    let bf16s: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::bf16::from_f64(v * 0.3).to_le_bytes())
        .collect();
    let int8s: Vec<u8> = (0..n).map(|i| (i % 255) as u8).collect();
    let mut specs = Vec::new();
    for kind in [
        Kind::Sgd,
        Kind::Adam,
        Kind::Adamw,
        Kind::Rmsprop,
        Kind::Adagrad,
    ] {
        let mut plain = spec(kind, 0.01);
        plain.weight_decay = 0.004;
        plain.initial_accumulator_value = 0.1;
        let mut fancy = plain.clone();
        fancy.momentum = 0.9;
        fancy.nesterov = true;
        fancy.centered = true;
        specs.extend([plain, fancy]);
    }
    for spec in &specs {
        let o = Optimizer::from_pb(Some(spec)).unwrap();
        let f32s: Vec<u8> = values
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect();
        let f64s: Vec<u8> = values.iter().flat_map(|&v| v.to_le_bytes()).collect();
        let g32: Vec<u8> = values
            .iter()
            .rev()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect();
        let g64: Vec<u8> = values.iter().rev().flat_map(|&v| v.to_le_bytes()).collect();
        let int8 = Gradient::Int8 {
            data: &int8s,
            scale: 0.01,
        };
        for grad in [Gradient::Same(&g32), Gradient::Bf16(&bf16s), int8] {
            run::<f32, f32>(&o, &f32s, &grad);
        }
        for grad in [Gradient::Same(&g64), Gradient::Bf16(&bf16s), int8] {
            run::<f64, f64>(&o, &f64s, &grad);
        }
    }
}

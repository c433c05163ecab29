use super::*;

struct Case {
    batch: i32,
    steps: i32,
    key_heads: i32,
    value_heads: i32,
    key_dim: i32,
    value_dim: i32,
}

/// Random inputs of `c`'s shapes in `dtype` (the state in float32).
fn inputs(c: &Case, seed: u64, dtype: Dtype) -> Result<[Array; 6], Exception> {
    let key = mlx_rs::random::key(seed)?;
    let normal = |shape: &[i32], scale: f32| -> Result<Array, Exception> {
        mlx_rs::random::normal::<f32>(shape, None, Some(scale), &key)
    };
    let qk = [c.batch, c.steps, c.key_heads, c.key_dim];
    let gates = [c.batch, c.steps, c.value_heads];
    let cast = |a: Array| a.as_dtype(dtype);
    Ok([
        cast(normal(&qk, 0.2)?)?,
        cast(normal(&qk, 0.2)?)?,
        cast(normal(
            &[c.batch, c.steps, c.value_heads, c.value_dim],
            1.0,
        )?)?,
        mlx_rs::random::uniform::<f32, f32>(0.0, 1.0, &gates, &key)?,
        cast(mlx_rs::random::uniform::<f32, f32>(0.0, 1.0, &gates, &key)?)?,
        normal(&[c.batch, c.value_heads, c.value_dim, c.key_dim], 2.0)?,
    ])
}

fn view(a: &[Array; 6]) -> DeltaInputs<'_> {
    DeltaInputs {
        q: &a[0],
        k: &a[1],
        v: &a[2],
        g: &a[3],
        beta: &a[4],
        state: &a[5],
    }
}

/// Ours against MLX's ops: readouts and every kept state bit for bit, then
/// a second call from the last kept state (our transposed view) against
/// MLX's ops continuing from theirs.
fn check(c: &Case, dtype: Dtype, keep_from: usize) -> Result<(), Exception> {
    let a = inputs(c, 3 + c.steps as u64, dtype)?;
    let ours = recur(view(&a), keep_from)?.expect("the fast path takes these shapes");
    let (y, states) = recur_with_mlx(view(&a))?;
    assert!(same(&ours.y, &y)?, "readouts differ");
    assert_eq!(ours.kept.len(), states.len() - keep_from.min(states.len()));
    for (i, kept) in ours.kept.iter().enumerate() {
        assert!(same(kept, &states[keep_from + i])?, "state {i} differs");
    }
    let Some(last) = ours.kept.last() else {
        return Ok(());
    };
    let b = inputs(c, 99, dtype)?;
    let ours = recur(
        DeltaInputs {
            state: last,
            ..view(&b)
        },
        0,
    )?
    .expect("the fast path takes our own state");
    let theirs = recur_with_mlx(DeltaInputs {
        state: states.last().expect("a state per position"),
        ..view(&b)
    })?;
    assert!(
        same(&ours.y, &theirs.0)?,
        "readouts from a kept state differ"
    );
    Ok(())
}

#[test]
fn the_probe_passes_here() {
    assert!(
        matches_mlx(),
        "the gated delta probe failed on this machine"
    );
}

#[test]
fn recurrence_gives_mlx_bits() -> Result<(), Exception> {
    let cases = [
        // One position, one head, odd widths.
        Case {
            batch: 1,
            steps: 1,
            key_heads: 1,
            value_heads: 1,
            key_dim: 5,
            value_dim: 3,
        },
        // A verify window of a real model's head sizes, grouped heads.
        Case {
            batch: 1,
            steps: 4,
            key_heads: 2,
            value_heads: 4,
            key_dim: 128,
            value_dim: 128,
        },
        // Two sequences, a prompt chunk.
        Case {
            batch: 2,
            steps: 9,
            key_heads: 3,
            value_heads: 3,
            key_dim: 32,
            value_dim: 24,
        },
    ];
    for c in &cases {
        for keep_from in [0, c.steps as usize - 1] {
            check(c, Dtype::Float32, keep_from)?;
        }
        check(c, Dtype::Bfloat16, 0)?;
    }
    Ok(())
}

#[test]
fn shapes_that_do_not_fit_are_declined() -> Result<(), Exception> {
    let c = Case {
        batch: 1,
        steps: 2,
        key_heads: 2,
        value_heads: 3,
        key_dim: 4,
        value_dim: 4,
    };
    // Three value heads over two key heads: not a whole repeat.
    let a = inputs(&c, 1, Dtype::Float32)?;
    assert!(recur(view(&a), 0)?.is_none());
    Ok(())
}

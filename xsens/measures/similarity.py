"""Representation similarity (linear CKA) and per-layer linear probes.

- Linear CKA (centred kernel alignment with linear kernels): Kornblith et al.,
  "Similarity of Neural Network Representations Revisited", ICML 2019,
  arXiv 1905.00414. For column-centred features X [n, d1], Y [n, d2],

    CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)
              = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)),
    K = X X^T, L = Y Y^T, HSIC(K, L) = tr(K H L H) / (n - 1)^2,

  which is invariant to orthogonal transforms and isotropic scaling of either
  input (not to arbitrary invertible linear maps).
- Minibatch CKA: Nguyen, Raghu and Kornblith, "Do Wide and Deep Networks Learn
  the Same Things?", ICLR 2021, arXiv 2010.15327. Averages the unbiased HSIC
  estimator of Song et al. (JMLR 2012) over minibatches,

    CKA_mb = mean_i HSIC_1(K_i, L_i)
             / sqrt(mean_i HSIC_1(K_i, K_i) mean_i HSIC_1(L_i, L_i)),

  so memory is O(batch^2) whatever the number of examples, and each HSIC term
  is unbiased (the ratio is consistent, with a bias that vanishes as the
  number of batches grows; it is not the full-data CKA, whose own bias is
  O(1/n)).
- Layer correlation and per-layer probes follow Bhojanapalli et al.,
  "Understanding Robustness of Transformers for Image Classification",
  ICCV 2021, arXiv 2103.14586 ("activations from later layers are highly
  correlated with each other"); the exact measure of that paper is not known,
  linear CKA between every pair of layers is our default.

Calling convention (that of `xsens.measures`): the one function that runs a model,
`layer_features(apply_fn, variables, inputs, *, filter, pooling)`, needs the model's
internals, so its `apply_fn` must be a flax apply in eval mode that forwards the
keywords `capture_intermediates` and `mutable` (e.g. `TrainResult.apply_fn` =
`functools.partial(model.apply, train=False)`); it returns a dict of per-layer arrays
and is not jitted internally (callers jit, `apply_fn`, `filter` and `pooling` static).
The CKA and probe functions take feature arrays, not models.

Everything here is pure and jittable (shapes and `pooling` / `filter` are
static); CKA is differentiable. Computation is in float32 with HIGHEST matmul
precision (TPUs otherwise use bf16 passes).
"""

import functools
import re
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
Features = Union[Array, Sequence[Array]]

_HIGHEST = jax.lax.Precision.HIGHEST
_dot = functools.partial(jnp.matmul, precision=_HIGHEST)

POOLINGS = ("mean", "cls", "flatten")

# Outputs of the residual blocks / hidden layers of the xsens model zoo:
# ViT `encoderblock_i`, ResNet18 `stageS_blockB`, MLP `hidden_i`, CNN
# `conv_i` and ConvMixer `blockI_pointwise_bn` (the end of each mixer block).
DEFAULT_LAYER_PATTERN = (
    r"encoderblock_\d+|stage\d+_block\d+|hidden_\d+|conv_\d+"
    r"|block\d+_pointwise_bn")


# ----------------------------------------------------------------------------
# Linear CKA on full data.
# ----------------------------------------------------------------------------


def _as_features(x: Array) -> Array:
  x = jnp.asarray(x)
  if x.ndim != 2:
    raise ValueError(f"features must be [n, d], got shape {tuple(x.shape)}.")
  return x.astype(jnp.float32)


def _center(x: Array) -> Array:
  return x - x.mean(axis=0, keepdims=True)


def _safe_ratio(num: Array, den: Array) -> Array:
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


@jax.jit
def linear_cka(x: Array, y: Array) -> Array:
  """Linear CKA between two representations of the same n examples.

  Uses the feature-space form ||Y^T X||_F^2 / (||X^T X|| ||Y^T Y||) when
  n > max(d1, d2) and the Gram form <K_c, L_c>_F / (||K_c|| ||L_c||) with
  centred Grams K_c = X_c X_c^T otherwise; the two are equal.

  Args:
    x: [n, d1] features (rows are examples).
    y: [n, d2] features of the same examples.

  Returns:
    scalar in [0, 1]; 0 if either input is constant over examples.
  """
  x, y = _as_features(x), _as_features(y)
  if x.shape[0] != y.shape[0]:
    raise ValueError(f"x and y need the same number of examples, got "
                     f"{x.shape[0]} and {y.shape[0]}.")
  x, y = _center(x), _center(y)
  n = x.shape[0]
  if n > max(x.shape[1], y.shape[1]):
    xy = jnp.sum(jnp.square(_dot(y.T, x)))
    xx = jnp.linalg.norm(_dot(x.T, x))
    yy = jnp.linalg.norm(_dot(y.T, y))
  else:
    k, l = _dot(x, x.T), _dot(y, y.T)
    xy = jnp.sum(k * l)
    xx, yy = jnp.linalg.norm(k), jnp.linalg.norm(l)
  return _safe_ratio(xy, xx * yy)


def _centered_gram(x: Array) -> Array:
  x = _center(_as_features(x))
  return _dot(x, x.T)


@jax.jit
def cka_matrix(features_a: Sequence[Array],
               features_b: Optional[Sequence[Array]] = None) -> Array:
  """Linear CKA between every pair of layers, full-data form.

  One centred n x n Gram per layer, so memory is O((La + Lb) n^2): for large
  n use the minibatch accumulator (`hsic_init` / `hsic_accumulate` /
  `cka_from_accumulated`) instead.

  Args:
    features_a: La arrays [n, d_i] (e.g. `layer_features(...).values()`).
    features_b: Lb arrays [n, d_j] of the same examples; None = features_a.

  Returns:
    [La, Lb] CKA matrix (symmetric with unit diagonal when b is None).
  """
  grams_a = jnp.stack([_centered_gram(f) for f in features_a])
  grams_b = grams_a if features_b is None else jnp.stack(
      [_centered_gram(f) for f in features_b])
  if grams_a.shape[1:] != grams_b.shape[1:]:
    raise ValueError("features_a and features_b need the same examples.")
  hsic = jnp.einsum("aij,bij->ab", grams_a, grams_b, precision=_HIGHEST)
  norm_a = jnp.sqrt(jnp.einsum("aij,aij->a", grams_a, grams_a,
                               precision=_HIGHEST))
  norm_b = jnp.sqrt(jnp.einsum("bij,bij->b", grams_b, grams_b,
                               precision=_HIGHEST))
  return _safe_ratio(hsic, norm_a[:, None] * norm_b[None, :])


# ----------------------------------------------------------------------------
# Minibatch CKA (unbiased HSIC accumulated over batches).
# ----------------------------------------------------------------------------


def unbiased_hsic(k: Array, l: Array, n: Array | None = None) -> Array:
  """Unbiased HSIC estimator of Song et al. (2012), eq. (5).

    HSIC_1 = [tr(K~ L~) + 1^T K~ 1 1^T L~ 1 / ((n-1)(n-2))
              - 2 / (n-2) 1^T K~ L~ 1] / (n (n-3)),

  with K~, L~ the Grams with zeroed diagonals. Batched over leading axes.

  Args:
    k: [..., m, m] Gram matrix (need not be centred).
    l: [..., m, m] Gram matrix of the same examples.
    n: the number of real examples (may be traced), when rows and columns of padding
      examples are zero in `k` and `l` (see `hsic_accumulate`'s mask); default m.

  Returns:
    [...] unbiased HSIC; n must be >= 4.
  """
  size = k.shape[-1]
  if n is None:
    if size < 4:
      raise ValueError(f"the unbiased HSIC needs n >= 4 examples, got {size}.")
    n = size
  eye = jnp.eye(size, dtype=bool)
  k = jnp.where(eye, 0.0, k)
  l = jnp.where(eye, 0.0, l)
  trace = jnp.sum(k * l, axis=(-2, -1))
  sum_k = k.sum(axis=(-2, -1))
  sum_l = l.sum(axis=(-2, -1))
  cross = jnp.sum(k.sum(-1) * l.sum(-1), axis=-1)   # 1^T K~ L~ 1 (symmetric)
  return (trace + sum_k * sum_l / ((n - 1) * (n - 2))
          - 2.0 * cross / (n - 2)) / (n * (n - 3))


def hsic_init(num_layers_a: Optional[int] = None,
              num_layers_b: Optional[int] = None) -> dict[str, Array]:
  """Empty minibatch-CKA accumulator.

  Args:
    num_layers_a: La for a layer-by-layer matrix; None for a single pair of
      arrays (then `hsic_accumulate` takes arrays and the result is a scalar).
    num_layers_b: Lb; defaults to num_layers_a.

  Returns:
    state {"xy": [La, Lb] or (), "xx": [La] or (), "yy": [Lb] or (),
    "count": int32 number of batches}; sums of unbiased HSIC terms.
  """
  if num_layers_a is None:
    if num_layers_b is not None:
      raise ValueError("num_layers_b needs num_layers_a.")
    shape_a = shape_b = ()
    shape_ab = ()
  else:
    num_layers_b = num_layers_a if num_layers_b is None else num_layers_b
    shape_a, shape_b = (num_layers_a,), (num_layers_b,)
    shape_ab = (num_layers_a, num_layers_b)
  return dict(xy=jnp.zeros(shape_ab, jnp.float32),
              xx=jnp.zeros(shape_a, jnp.float32),
              yy=jnp.zeros(shape_b, jnp.float32),
              count=jnp.zeros((), jnp.int32))


def _grams(features: Features) -> Array:
  """[n, d] -> [n, n], or a sequence of L arrays [n, d_i] -> [L, n, n]."""
  if isinstance(features, (list, tuple)):
    return jnp.stack([_dot(f, f.T) for f in map(_as_features, features)])
  f = _as_features(features)
  return _dot(f, f.T)


@jax.jit
def hsic_accumulate(state: dict[str, Array], x: Features, y: Features,
                    mask: Array | None = None) -> dict[str, Array]:
  """Adds one minibatch to a minibatch-CKA accumulator (Nguyen et al. 2021).

  Args:
    state: from `hsic_init` (or a previous call).
    x: [n, d1] features, or a sequence of La arrays [n, d_i] (matching the
      state), for one minibatch of n >= 4 examples.
    y: [n, d2] or a sequence of Lb arrays, for the same examples.
    mask: optional [n] (1 = real example, 0 = padding). The batch's HSIC terms are
      those of its real examples alone; a batch with fewer than 4 real examples adds
      nothing (not even to "count").

  Returns:
    the new state (a pure function; jittable, e.g. inside a scan).
  """
  k, l = _grams(x), _grams(y)
  if k.ndim != state["xx"].ndim + 2 or l.ndim != state["yy"].ndim + 2:
    raise ValueError("pass arrays with hsic_init() and sequences of layers "
                     "with hsic_init(num_layers_a, num_layers_b).")
  n, use = None, 1
  if mask is not None:
    m = mask.astype(jnp.float32)
    pair = m[:, None] * m[None, :]
    k, l, n = k * pair, l * pair, jnp.sum(m)
    use = (n >= 4).astype(jnp.float32)
    n = jnp.maximum(n, 4.0)   # Keeps the unused estimate finite.
  if k.ndim == 2:
    xy, xx, yy = (unbiased_hsic(k, l, n), unbiased_hsic(k, k, n),
                  unbiased_hsic(l, l, n))
  else:
    xy = unbiased_hsic(k[:, None], l[None, :], n)
    xx, yy = unbiased_hsic(k, k, n), unbiased_hsic(l, l, n)
  return dict(xy=state["xy"] + use * xy, xx=state["xx"] + use * xx,
              yy=state["yy"] + use * yy,
              count=state["count"] + jnp.asarray(use, jnp.int32))


def cka_from_accumulated(state: dict[str, Array]) -> Array:
  """Minibatch CKA: scalar, or [La, Lb] for a layer-by-layer accumulator.

  Unbiased HSIC can be slightly negative for (nearly) independent features;
  the estimate is returned as is (not clipped), and is 0 where a
  self-similarity term is not positive.
  """
  xx, yy = state["xx"], state["yy"]
  if xx.ndim:
    den = jnp.sqrt(jnp.maximum(xx[:, None] * yy[None, :], 0.0))
    den = jnp.where((xx[:, None] > 0) & (yy[None, :] > 0), den, 0.0)
  else:
    den = jnp.where((xx > 0) & (yy > 0), jnp.sqrt(jnp.maximum(xx * yy, 0.0)),
                    0.0)
  return _safe_ratio(state["xy"], den)


@functools.partial(jax.jit, static_argnames=("batch_size",))
def minibatch_cka(x: Features, y: Features, batch_size: int) -> Array:
  """Minibatch CKA over consecutive batches of `batch_size` examples.

  A convenience over `hsic_accumulate` for data already in memory; trailing
  examples that do not fill a batch are dropped. Shuffle first if the order
  of the examples is not random.

  Args:
    x: [n, d1] or a sequence of La arrays [n, d_i].
    y: [n, d2] or a sequence of Lb arrays [n, d_j].
    batch_size: static, >= 4.

  Returns:
    scalar, or [La, Lb] for sequences.
  """
  multi = isinstance(x, (list, tuple))
  xs = list(x) if multi else [x]
  ys = list(y) if isinstance(y, (list, tuple)) else [y]
  if multi != isinstance(y, (list, tuple)):
    raise ValueError("x and y must both be arrays or both be sequences.")
  n = xs[0].shape[0]
  num = n // batch_size
  if num < 1:
    raise ValueError(f"batch_size={batch_size} exceeds n={n}.")
  state = hsic_init(len(xs), len(ys)) if multi else hsic_init()

  def batches(fs):
    return [jnp.asarray(f)[:num * batch_size].reshape(
        num, batch_size, *f.shape[1:]) for f in fs]

  def body(s, batch):
    bx, by = batch
    return hsic_accumulate(s, bx if multi else bx[0],
                           by if multi else by[0]), None

  state, _ = jax.lax.scan(body, state, (batches(xs), batches(ys)))
  return cka_from_accumulated(state)


# ----------------------------------------------------------------------------
# Per-layer features from a flax model.
# ----------------------------------------------------------------------------


def _pool(x: Array, pooling: str, name: str) -> Array:
  """Layer output [n, ...] -> [n, features]."""
  if pooling == "flatten" or x.ndim == 2:
    return x.reshape(x.shape[0], -1)
  if pooling == "cls":
    if x.ndim != 3:
      raise ValueError(f"pooling='cls' needs token outputs [n, T, D]; layer "
                       f"{name!r} has shape {tuple(x.shape)}.")
    return x[:, 0]
  return x.reshape(x.shape[0], -1, x.shape[-1]).mean(axis=1)


def _layer_filter(pattern: Union[str, Callable[[nn.Module, str], bool]]
                  ) -> Callable[[nn.Module, str], bool]:
  if callable(pattern):
    return pattern
  regex = re.compile(pattern)

  def keep(module: nn.Module, method_name: str) -> bool:
    path = "/".join(module.scope.path) if module.scope is not None else ""
    return method_name == "__call__" and regex.fullmatch(path) is not None

  return keep


def layer_features(apply_fn: Callable[..., Any], variables: Mapping[str, Any],
                   inputs: Array, *,
                   filter: Union[str, Callable[[nn.Module, str], bool]] = (  # pylint: disable=redefined-builtin
                       DEFAULT_LAYER_PATTERN),
                   pooling: str = "mean") -> dict[str, Array]:
  """Per-layer activations of a flax model, flattened to [n, features].

  Runs `apply_fn(variables, inputs)` once with flax's `capture_intermediates` and
  keeps the `__call__` outputs of the submodules selected by `filter`.

  Pooling (static):
    - "mean": token outputs [n, T, D] -> mean over tokens (CLS included);
      feature maps [n, H, W, C] -> global average pool [n, C].
    - "cls": token outputs -> token 0 (the CLS token of a ViT with
      pooling="cls"; for a mean-pooled ViT token 0 is just the first patch).
      Raises for non-token outputs.
    - "flatten": [n, prod(rest)] (Kornblith et al. 2019 flatten conv maps;
      memory grows with the spatial size).
  Outputs that are already [n, d] are kept as they are. For CKA on ViTs
  offer both "cls" and "mean" (Bhojanapalli et al. 2021 do not say which they
  used). Rows are independent: padding rows come back as rows (drop them).

  Args:
    apply_fn: a flax apply in eval mode, e.g. `functools.partial(model.apply,
      train=False)`; called as apply_fn(variables, inputs,
      capture_intermediates=..., mutable=["intermediates"]).
    variables: its variables ({"params": ..., "batch_stats": ...}).
    inputs: [n, H, W, C] inputs; batch over n outside for large n (features
      of different batches concatenate along axis 0).
    filter: a regex matched (fullmatch) against the module path joined by "/"
      (default `DEFAULT_LAYER_PATTERN`: ViT `encoderblock_i`, ResNet
      `stageS_blockB`, MLP `hidden_i`, ...), or a callable
      (module, method_name) -> bool as flax's `capture_intermediates` takes
      (static under the caller's jit and keyed by identity: define it once, not
      as a fresh lambda per call, or every call recompiles).
    pooling: "mean", "cls" or "flatten".

  Returns:
    dict {module path: [n, features] float32} in forward (call) order (a caller's
    jit returns dict keys sorted as strings).
  """
  if pooling not in POOLINGS:
    raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}.")
  _, state = apply_fn(variables, inputs,
                      capture_intermediates=_layer_filter(filter),
                      mutable=["intermediates"])
  flat = flax.traverse_util.flatten_dict(
      flax.core.unfreeze(state["intermediates"]))
  out = {}
  for path, value in flat.items():
    if path[-1] != "__call__":
      continue       # e.g. attention weights sown by the ViT.
    name = "/".join(path[:-1])
    out[name] = _pool(value[0], pooling, name).astype(jnp.float32)
  return out


# ----------------------------------------------------------------------------
# Linear probes.
# ----------------------------------------------------------------------------


def _num_classes(labels: Array, num_classes: Optional[int]) -> int:
  """num_classes, or max(labels) + 1 for concrete labels."""
  if num_classes is not None:
    return num_classes
  if isinstance(labels, jax.core.Tracer):
    raise ValueError("pass num_classes when labels are traced.")
  return int(jnp.max(jnp.asarray(labels))) + 1


def ridge_classifier(features: Array, labels: Array, *, l2: float = 1e-3,
                     num_classes: Optional[int] = None
                     ) -> tuple[Array, Array]:
  """Closed-form ridge regression onto one-hot targets.

  Minimises ||X_c W - Y_c||^2 + lam ||W||^2 with X_c, Y_c centred by their
  training means (an unpenalised intercept) and lam = l2 * tr(X_c^T X_c) / d,
  i.e. l2 relative to the mean eigenvalue, so the probe does not depend on
  the feature scale. Solves the d x d primal system when n >= d and the
  n x n dual one otherwise (same solution). Deterministic, no iterations.

  Args:
    features: [n, d] training features.
    labels: int [n] training labels.
    l2: relative ridge strength (> 0).
    num_classes: K; inferred from concrete labels if None.

  Returns:
    (weights [d, K], bias [K]); logits = features @ weights + bias.
  """
  return _ridge(features, labels, l2, _num_classes(labels, num_classes))


@functools.partial(jax.jit, static_argnames=("num_classes",))
def _ridge(features: Array, labels: Array, l2: Any,
           num_classes: int) -> tuple[Array, Array]:
  x = _as_features(features)
  y = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  mx, my = x.mean(0), y.mean(0)
  xc, yc = x - mx, y - my
  n, d = xc.shape
  lam = l2 * jnp.sum(jnp.square(xc)) / d
  lam = jnp.where(lam > 0, lam, l2)
  if n >= d:
    a = _dot(xc.T, xc) + lam * jnp.eye(d)
    w = jax.scipy.linalg.solve(a, _dot(xc.T, yc), assume_a="pos")
  else:
    a = _dot(xc, xc.T) + lam * jnp.eye(n)
    w = _dot(xc.T, jax.scipy.linalg.solve(a, yc, assume_a="pos"))
  return w, my - _dot(mx, w)


def linear_probe_accuracy(train_feats: Array, train_labels: Array,
                          test_feats: Array, test_labels: Array, *,
                          l2: float = 1e-3,
                          num_classes: Optional[int] = None) -> Array:
  """Top-1 accuracy of a closed-form ridge probe (`ridge_classifier`).

  Args:
    train_feats: [n, d] features the probe is fitted on.
    train_labels: int [n].
    test_feats: [m, d] features it is scored on.
    test_labels: int [m].
    l2: relative ridge strength.
    num_classes: K; inferred from the concrete labels of both sets if None.

  Returns:
    scalar accuracy in [0, 1].
  """
  if num_classes is None:
    num_classes = max(_num_classes(train_labels, None),
                      _num_classes(test_labels, None))
  return _probe_accuracy(train_feats, train_labels, test_feats, test_labels,
                         l2, num_classes)


@functools.partial(jax.jit, static_argnames=("num_classes",))
def _probe_accuracy(train_feats: Array, train_labels: Array,
                    test_feats: Array, test_labels: Array, l2: Any,
                    num_classes: int) -> Array:
  w, b = _ridge(train_feats, train_labels, l2, num_classes)
  pred = jnp.argmax(_dot(_as_features(test_feats), w) + b, axis=-1)
  return jnp.mean(pred == jnp.asarray(test_labels))


def layerwise_probe_accuracy(train_features: Mapping[str, Array],
                             train_labels: Array,
                             test_features: Mapping[str, Array],
                             test_labels: Array, **kwargs) -> dict[str, Array]:
  """`linear_probe_accuracy` for every layer of two `layer_features` dicts."""
  return {name: linear_probe_accuracy(train_features[name], train_labels,
                                      test_features[name], test_labels,
                                      **kwargs)
          for name in train_features}

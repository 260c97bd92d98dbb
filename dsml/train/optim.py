"""Generated from notebooks/week3_data_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 117
import numpy as np

OPTIMIZERS = ("sgd", "momentum", "adam", "lars", "lamb")


class Optimizer:
    """Updates named parameter arrays in place from named gradients: `step(params, grads)`.
    Parameters with no gradient (frozen ones) are left alone. `lr` may change between steps."""

    def __init__(self, lr: float, weight_decay: float = 0.0):
        if not lr >= 0 or not weight_decay >= 0:
            raise ValueError(f"lr and weight_decay must be ≥ 0, got lr={lr}, "
                             f"weight_decay={weight_decay}")
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self.state = {}         # per parameter name: moments, velocities
        self.steps = 0
        self.trust = {}         # LARS/LAMB: the last trust ratio of each parameter

    def step(self, params, grads) -> None:
        self.steps += 1
        for name, g in grads.items():
            w = params[name]
            if g.shape != w.shape:
                raise ValueError(f"gradient of {name} has shape {g.shape}, parameter {w.shape}")
            self.update(name, w, np.asarray(g, dtype=w.dtype))

    def update(self, name, w, g) -> None:       # pragma: no cover - each optimizer has one
        raise NotImplementedError


def _trust_ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if numerator > 0 and denominator > 0 else 1.0


class SGD(Optimizer):
    def __init__(self, lr, weight_decay=0.0, momentum=0.0):
        super().__init__(lr, weight_decay)
        self.momentum = float(momentum)

    def update(self, name, w, g):
        d = g + self.weight_decay * w if self.weight_decay else g
        if self.momentum:
            v = self.state.get(name)
            v = d.copy() if v is None else self.momentum * v + d
            self.state[name] = v
            d = v
        w -= self.lr * d


# -- cell 118
class Adam(Optimizer):
    def __init__(self, lr, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(lr, weight_decay)
        self.betas, self.eps = tuple(betas), float(eps)

    def moments(self, name, g):
        """Bias-corrected first and second moments of this parameter's gradients. Each
        parameter counts its own steps (as torch.optim.Adam does): one that had no gradient for
        a while — frozen, say — is corrected for the steps it actually took."""
        b1, b2 = self.betas
        m, v, t = self.state.get(name, (np.zeros_like(g), np.zeros_like(g), 0))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        t += 1
        self.state[name] = (m, v, t)
        return m / (1 - b1 ** t), v / (1 - b2 ** t)

    def update(self, name, w, g):
        if self.weight_decay:
            g = g + self.weight_decay * w
        m_hat, v_hat = self.moments(name, g)
        w -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


class LARS(Optimizer):
    def __init__(self, lr, weight_decay=0.0, momentum=0.9, trust_coefficient=0.001):
        super().__init__(lr, weight_decay)
        self.momentum, self.trust_coefficient = float(momentum), float(trust_coefficient)

    def update(self, name, w, g):
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
        # 1 when either norm is 0 (a fresh bias, a parameter with no gradient this step)
        local = (self.trust_coefficient * w_norm / (g_norm + self.weight_decay * w_norm)
                 if w_norm > 0 and g_norm > 0 else 1.0)
        self.trust[name] = local
        v = self.state.get(name, np.zeros_like(w))
        v = self.momentum * v + local * (g + self.weight_decay * w)
        self.state[name] = v
        w -= self.lr * v


class LAMB(Adam):
    def __init__(self, lr, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-6):
        super().__init__(lr, weight_decay, betas, eps)

    def update(self, name, w, g):
        m_hat, v_hat = self.moments(name, g)
        r = m_hat / (np.sqrt(v_hat) + self.eps) + self.weight_decay * w
        trust = _trust_ratio(np.linalg.norm(w), np.linalg.norm(r))
        self.trust[name] = trust
        w -= self.lr * trust * r


# -- cell 119
def make_optimizer(name: str, lr: float, **hyper) -> Optimizer:
    """One of OPTIMIZERS by name, with its hyper-parameters (see the table above)."""
    if name == "sgd":
        return SGD(lr, **hyper)
    if name == "momentum":
        hyper.setdefault("momentum", 0.9)
        return SGD(lr, **hyper)
    if name == "adam":
        return Adam(lr, **hyper)
    if name == "lars":
        return LARS(lr, **hyper)
    if name == "lamb":
        return LAMB(lr, **hyper)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")

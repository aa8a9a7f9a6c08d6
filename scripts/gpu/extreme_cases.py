"""Runs the CUDA kernels' log-space totals (See Note [Log-space totals]) and
wide integer counts (Note [Wide integer counts]) once each on small inputs,
for compute-sanitizer: log_alpha beyond the dtype's exp range in dense
shared and per-sample alpha (the small, table, ring and row ways),
components and CSR, forward and backward, float32 and float64. Exits
non-zero on a non-finite or wrong answer (against the CPU in float64)."""
import torch

import dirmult_ext as dm

EXTREME = {torch.float32: (-200.0, 150.0), torch.float64: (-900.0, 800.0)}


def draw(shape, dtype, gen):
    lo, hi = EXTREME[dtype]
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    la = torch.where(torch.rand(shape, generator=gen) < 0.5, lo * (0.5 + u), hi * (0.6 + u))
    normal = torch.randn(shape, generator=gen, dtype=torch.float64)
    return torch.where(torch.rand(shape, generator=gen) < 0.3, normal, la)


def check(name, kind, B, V, K, dtype, gen):
    la = draw((B, V) if kind == "per_sample" else (K, V), dtype, gen)
    counts = torch.randint(0, 8, (B, V), generator=gen).double()
    counts = counts * (torch.rand(B, V, generator=gen) < 0.3)
    counts[:, 0] += 1
    counts[0, 1] = 200
    la_k = la[0] if kind in ("shared", "csr") and K == 1 else la
    per_component = kind == "components" or (kind == "csr" and K > 1)
    f = dm.log_lik_components if per_component else dm.log_lik

    def run(device, dt):
        x = counts.to(device=device, dtype=dt)
        x = x.to_sparse_csr() if kind == "csr" else x
        l = la_k.to(device=device, dtype=dt).requires_grad_()
        out = f(x, l)
        (g,) = torch.autograd.grad(out.sum(), l)
        return out.detach().double().cpu(), g.double().cpu()

    out, g = run("cuda", dtype)
    ref, gref = run("cpu", torch.float64)
    tol = 1e-3 if dtype == torch.float32 else 1e-8
    ok = (torch.isfinite(out).all() and torch.isfinite(g).all()
          and ((out - ref).abs() <= tol * (1 + ref.abs())).all())
    print(f"{name}: {'ok' if ok else 'WRONG'}")
    return bool(ok)


def main():
    gen = torch.Generator().manual_seed(0)
    cases = [("shared small", "shared", 8, 40, 1), ("shared tables", "shared", 64, 1500, 1),
             ("shared ring", "shared", 2, 20000, 1), ("per-sample", "per_sample", 8, 300, 1),
             ("per-sample chunks", "per_sample", 3, 9000, 1),
             ("components", "components", 16, 300, 3), ("CSR", "csr", 32, 500, 1),
             ("CSR components", "csr", 32, 500, 3)]
    ok = True
    for dtype in (torch.float32, torch.float64):
        for name, kind, B, V, K in cases:
            ok &= check(f"{name} {dtype}", kind, B, V, K, dtype, gen)
    # Wide integer counts with float32 log_alpha.
    c = torch.tensor([[2 ** 24 + 1, 3, 0], [2 ** 24 + 7, 0, 5]], device="cuda")
    la = torch.zeros(3, device="cuda", requires_grad=True)
    out = dm.log_lik(c, la)
    torch.autograd.grad(out.sum(), la)
    ref = dm.log_lik(c.cpu(), la.detach().cpu().double())
    wide = bool(((out.detach().cpu().double() - ref).abs() < 1e-3).all())
    print(f"wide integer counts: {'ok' if wide else 'WRONG'}")
    raise SystemExit(0 if ok and wide else 1)


if __name__ == "__main__":
    main()

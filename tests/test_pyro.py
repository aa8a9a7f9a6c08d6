"""dirmult_ext.pyro.DirichletMultinomial in Pyro models, against Pyro's own
pyro.distributions.DirichletMultinomial: sampling in plates, Predictive,
trace log-probabilities, SVI with AutoDelta step by step, expand/to_event/
mask. Inputs are drawn fresh each run; the SVI comparison seeds both runs
alike."""
import pytest
import torch

pyro = pytest.importorskip("pyro")
import pyro.distributions as pdist  # noqa: E402
from pyro.infer import SVI, Predictive, Trace_ELBO  # noqa: E402
from pyro.infer.autoguide import AutoDelta  # noqa: E402

from dirmult_ext.integrations.pyro import DirichletMultinomial  # noqa: E402


def rand_alpha(*shape):
    return torch.rand(*shape, dtype=torch.float64) * 3 + 0.1


def ours(total, alpha):
    return DirichletMultinomial(total, alpha)


def pyros(total, alpha):
    return pdist.DirichletMultinomial(alpha, total)


@pytest.fixture(autouse=True)
def pyro_validation():
    pyro.clear_param_store()
    with pyro.validation_enabled(True):
        yield


def test_sample_in_plates_and_trace_log_prob():
    """No obs: draws of plate shape with the right totals; the trace's
    log_prob per site and in sum equal Pyro's DirichletMultinomial's."""
    V = 5
    alpha = rand_alpha(3, V)                     # batch (3,) along the inner plate
    total = torch.randint(1, 30, (3,)).double()

    def model(make):
        with pyro.plate("outer", 4, dim=-2), pyro.plate("inner", 3, dim=-1):
            return pyro.sample("x", make(total, alpha))

    tr = pyro.poutine.trace(model).get_trace(ours)
    x = tr.nodes["x"]["value"]
    assert x.shape == (4, 3, V)
    assert torch.equal(x.sum(-1), total.expand(4, 3))
    tr.compute_log_prob()
    ref = pyro.poutine.trace(pyro.poutine.condition(model, data={"x": x})).get_trace(pyros)
    ref.compute_log_prob()
    assert tr.nodes["x"]["log_prob"].shape == (4, 3)
    torch.testing.assert_close(tr.nodes["x"]["log_prob"], ref.nodes["x"]["log_prob"],
                               rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(tr.log_prob_sum(), ref.log_prob_sum(), rtol=1e-11, atol=1e-9)


def test_observed_in_plate_broadcasts():
    """A batch-free distribution observed in a plate: expanded to the plate,
    log_prob one per row, equal to Pyro's."""
    V, N = 4, 50
    alpha = rand_alpha(V)
    x = pdist.DirichletMultinomial(alpha, 20).sample((N,))

    def model(make):
        with pyro.plate("data", N):
            pyro.sample("x", make(20, alpha), obs=x)

    lps = []
    for make in (ours, pyros):
        tr = pyro.poutine.trace(model).get_trace(make)
        tr.compute_log_prob()
        assert tr.nodes["x"]["fn"].batch_shape == (N,)
        lps.append(tr.nodes["x"]["log_prob"])
    assert lps[0].shape == (N,)
    torch.testing.assert_close(lps[0], lps[1], rtol=1e-11, atol=1e-11)


def test_predictive():
    """Predictive from fixed concentrations: shapes, exact totals, and the
    draws' mean per category within 6 standard errors of the mean."""
    V, S, total = 3, 2000, 12
    alpha = rand_alpha(V) + 0.5

    def model():
        conc = pyro.sample("conc", pdist.LogNormal(torch.zeros(V, dtype=torch.float64),
                                                   1.0).to_event(1))
        with pyro.plate("data", 2):
            return pyro.sample("x", DirichletMultinomial(total, conc))

    # (S, 1, V): Predictive counts the event dimension as a batch one
    pred = Predictive(model, posterior_samples={"conc": alpha.expand(S, 1, V)},
                      return_sites=["x"], parallel=True)()
    x = pred["x"]
    assert x.shape == (S, 2, V)
    assert bool((x.sum(-1) == total).all())
    d = DirichletMultinomial(total, alpha)
    se = (d.variance / (2 * S)).sqrt()
    assert bool(((x.mean((0, 1)) - d.mean).abs() <= 6 * se).all()), (x.mean((0, 1)), d.mean)
    # without posterior samples: concentrations from the prior
    assert Predictive(model, num_samples=7)()["x"].shape == (7, 2, V)


def test_svi_autodelta_matches_pyro():
    """MAP of a concentration with AutoDelta: the same losses as with
    Pyro's DirichletMultinomial step by step (same seed), and the estimate
    near the concentration that generated the data."""
    V, N, total, steps = 4, 600, 40, 80
    truth = rand_alpha(V) + 0.5
    x = pdist.DirichletMultinomial(truth, total).sample((N,))
    seed = int(torch.randint(0, 2 ** 31, ()).item())

    def model(make):
        conc = pyro.sample("conc", pdist.LogNormal(torch.zeros(V, dtype=torch.float64),
                                                   2.0).to_event(1))
        with pyro.plate("data", N):
            pyro.sample("x", make(total, conc), obs=x)

    def run(make):
        pyro.clear_param_store()
        pyro.set_rng_seed(seed)
        guide = AutoDelta(model)
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.1}), Trace_ELBO())
        losses = [svi.step(make) for _ in range(steps)]
        return torch.tensor(losses, dtype=torch.float64), guide.median(make)["conc"].detach()

    loss_ours, conc_ours = run(ours)
    loss_ref, conc_ref = run(pyros)
    torch.testing.assert_close(loss_ours, loss_ref, rtol=1e-9, atol=1e-7)
    torch.testing.assert_close(conc_ours, conc_ref, rtol=1e-7, atol=1e-9)
    assert loss_ours[-1] < loss_ours[0]
    assert bool(((conc_ours - truth).abs() / truth < 0.3).all()), (conc_ours, truth)


def test_expand_to_event_mask():
    V = 5
    alpha = rand_alpha(3, V)
    total = torch.randint(1, 20, (3,)).double()
    d, ref = ours(total, alpha), pyros(total, alpha)
    x = d.sample((2,))
    e = d.expand_by([2])
    assert isinstance(e, DirichletMultinomial) and e.batch_shape == (2, 3)
    assert e.sample().shape == (2, 3, V)
    torch.testing.assert_close(e.log_prob(x), ref.expand_by([2]).log_prob(x),
                               rtol=1e-11, atol=1e-11)
    ind = d.to_event(1)
    assert ind.batch_shape == () and ind.event_shape == (3, V)
    torch.testing.assert_close(ind.log_prob(x), ref.log_prob(x).sum(-1), rtol=1e-11, atol=1e-11)
    mask = torch.tensor([True, False, True])
    lp = d.mask(mask).log_prob(x)
    torch.testing.assert_close(lp, ref.log_prob(x) * mask, rtol=1e-11, atol=1e-11)
    assert bool((lp[:, 1] == 0).all())
    assert DirichletMultinomial.infer_shapes(total_count=(2, 1), concentration=(3, V)) == \
        ((2, 3), (V,))


@pytest.mark.parametrize("value_shape,alpha_shape,total_shape", [
    ((3,), (3,), (3,)), ((5, 1, 3), (3,), (3,)), ((5, 3), (3,), ()), ((2, 1, 1, 3), (4, 3), (3, 1)),
    ((4, 1, 1, 3), (2, 1, 3), (6,)),
])
def test_log_prob_broadcasting_matches_pyro(value_shape, alpha_shape, total_shape):
    """log_prob's shape and values against Pyro's DirichletMultinomial,
    batch dimensions from total_count included."""
    alpha = rand_alpha(*alpha_shape)
    total = torch.randint(1, 20, total_shape).double()
    x = torch.randint(0, 7, value_shape).double()
    lp = DirichletMultinomial(total, alpha, validate_args=False).log_prob(x)
    ref = pdist.DirichletMultinomial(alpha, total, validate_args=False).log_prob(x)
    assert lp.shape == ref.shape
    torch.testing.assert_close(lp, ref, rtol=1e-11, atol=1e-11)

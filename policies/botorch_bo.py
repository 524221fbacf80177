"""Constrained Bayesian optimisation with BoTorch over the finite clock grid.

Per task two GPs (log time and log energy relative to the reference, over the unit-scaled
clocks) as a ModelListGP; qLogNoisyExpectedImprovement on -log cost with the time budget as
an outcome constraint, maximised over the unmeasured safe configs.

- `BotorchStrategy`: the strategy (`_pick`, `_acquisition`, `_safe`), its GPs (`model`, with
  hyperparameters refitted every `refit_every` points) and their curves (`curves`, `Curves`),
  which the cross-kernel strategy builds on;
- `torch_threads`: torch's thread count for the length of a block.

How it converges, handles several exchange rates and stays fast: docs/design-policies.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from botorch.acquisition.logei import qLogNoisyExpectedImprovement
from botorch.acquisition.objective import GenericMCObjective
from botorch.exceptions.warnings import BotorchWarning, OptimizationWarning
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP, SingleTaskGP
from botorch.optim import optimize_acqf_discrete
from botorch.sampling.normal import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood
from linear_operator.utils.warnings import NumericalWarning

from kdvfs.policies._common import SafeExplorer, TaskLog, log_ratios, safe_log_limit
from kdvfs.policies.base import SearchSpace, Task

TIME, ENERGY = 0, 1  # output order of the ModelListGP (indices, not knobs)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch with n intra-op threads inside the block, restoring the caller's setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@dataclass(frozen=True)
class _Fit:
    """Fitted GP hyperparameters of one task (time GP, energy GP) and the data size they saw."""

    n_obs: int
    states: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class Curves:
    """A task's predicted log time and log energy ratios at every config, with their s.d.

    Attributes:
        log_t, sd_t: posterior mean and s.d. of log(time / reference time), per config.
        log_e, sd_e: the same of log(energy / reference energy).
    """

    log_t: np.ndarray
    sd_t: np.ndarray
    log_e: np.ndarray
    sd_e: np.ndarray


def _hyperparameters(gp: SingleTaskGP) -> dict[str, torch.Tensor]:
    """A GP's fitted hyperparameters: its state without the data-dependent outcome scaling."""
    return {k: v.clone() for k, v in gp.state_dict().items() if not k.startswith("outcome_transform")}


class BotorchStrategy(SafeExplorer):
    """Constrained BO (docs/design-policies.md) after the shared initial design.

    Safe exploration: configs known over budget by monotonicity are never candidates, nor
    configs whose GP mean time (clipped to the monotone / physical bounds) exceeds
    (1 + 3 budget + margin) x reference. Never re-measures a config.

    Args:
        space, seed, max_per_task, margin, tol: as SafeExplorer.
        refit_every: new observations of a task between two hyperparameter fits.
        fit_maxiter: the most optimiser iterations of one fit.
        mc_samples: quasi-Monte-Carlo samples of the acquisition.
        threads: torch intra-op threads during an ask.
    """

    name = "botorch"

    def __init__(
        self,
        space: SearchSpace,
        seed: int,
        *,
        max_per_task: int | None = None,
        margin: float = 0.1,
        tol: float = 0.002,
        refit_every: int = 4,
        fit_maxiter: int = 25,
        mc_samples: int = 64,
        threads: int = 1,
    ) -> None:
        super().__init__(space, seed, max_per_task=max_per_task, margin=margin, tol=tol)
        self.refit_every = refit_every
        self.fit_maxiter = fit_maxiter
        self.mc_samples = mc_samples
        self.threads = threads
        self._x_all = torch.tensor(self.facts.unit, dtype=torch.double)
        self._fits: dict[str, _Fit] = {}
        self._last_fit: _Fit | None = None
        self._rate: dict[str, int] = {}  # task key -> index of the rate last picked for

    def _pick(self, task: Task, log: TaskLog) -> int | None:
        open_ = ~log.measured & ~self.facts.known_infeasible(log, task)
        if not open_.any() or log.measured.sum() < 2:
            return None
        with torch_threads(self.threads), warnings.catch_warnings(), torch.random.fork_rng():
            # Seeded: pruning the baseline draws unseeded samples otherwise.
            torch.manual_seed(self.seed)
            # Routine with few, noisy points: some posterior samples see no feasible baseline
            # point (botorch then bounds the objective from below) or need Cholesky jitter.
            warnings.filterwarnings("ignore", "When all training points are infeasible", BotorchWarning)
            warnings.simplefilter("ignore", NumericalWarning)
            model = self.model(task, log)
            cand = np.flatnonzero(open_ & self._safe(task, log, model))
            if cand.size == 0:
                return None
            relative_rates = self.relative_rates(task)
            first = self._rate.get(task.key, 0) % len(relative_rates)
            for r in (first + np.arange(len(relative_rates))) % len(relative_rates):
                x_next, log_ei = optimize_acqf_discrete(
                    self._acquisition(model, log, task, float(relative_rates[r])),
                    q=1,
                    choices=self._x_all[cand],
                )
                if float(log_ei.exp().max()) >= self.tol:
                    self._rate[task.key] = int(r)
                    return int(cand[torch.cdist(x_next, self._x_all[cand]).argmin()])
        return None

    def _acquisition(
        self, model: ModelListGP, log: TaskLog, task: Task, relative_rate: float
    ) -> qLogNoisyExpectedImprovement:
        """qLogNEI on -log cost at one rate, feasibility-weighted by the time budget."""
        log_relative_rate = float(np.log(relative_rate)) if relative_rate > 0 else -np.inf
        offset = float(np.log1p(relative_rate))
        limit_t = float(np.log1p(task.budget))

        def neg_log_cost(z: torch.Tensor, X: torch.Tensor | None = None) -> torch.Tensor:
            if relative_rate == 0:
                return -z[..., ENERGY]
            return offset - torch.logaddexp(z[..., ENERGY], z[..., TIME] + log_relative_rate)

        return qLogNoisyExpectedImprovement(
            model,
            X_baseline=self._x_all[self._baseline(log, task)],
            objective=GenericMCObjective(neg_log_cost),
            constraints=[lambda z: z[..., TIME] - limit_t],
            sampler=SobolQMCNormalSampler(torch.Size([self.mc_samples]), seed=self.seed),
        )

    def _baseline(self, log: TaskLog, task: Task) -> np.ndarray:
        """The measured configs the improvement is counted from: those not measured over the
        budget (a GP that smooths a steep time curve can call such a config feasible, and its
        energy then hides every cheaper config between it and the feasible ones); all measured
        ones when none is within."""
        measured = np.flatnonzero(log.measured)
        within = measured[~self.facts.known_infeasible(log, task)[measured]]
        return within if within.size else measured

    def _safe(self, task: Task, log: TaskLog, model: ModelListGP) -> np.ndarray:
        """Configs whose predicted time is within the wide safety limit."""
        mean_t = model.models[TIME].posterior(self._x_all).mean.squeeze(-1).detach().numpy()
        lower_t, upper_t = self.facts.log_time_bounds(log, task)
        return np.clip(mean_t, lower_t, upper_t) <= safe_log_limit(task, self.margin)

    def fitted_on(self, task_key: str) -> int | None:
        """How many observations of the task its GP hyperparameters were last fitted on (None:
        not fitted on its own data yet)."""
        fit = self._fits.get(task_key)
        return None if fit is None else fit.n_obs

    def model(self, task: Task, log: TaskLog) -> ModelListGP:
        """The task's GPs on all its data; hyperparameters refitted every refit_every points.
        A task without a fit of its own starts from the last fit of another (same grid, log
        ratios standardised: a fair first guess) until it has refit_every points of its own."""
        idx, y_t, y_e = log_ratios(log, task)
        x = self._x_all[idx]
        fit = self._fits.get(task.key)
        if fit is None and self._last_fit is not None:
            fit = _Fit(0, self._last_fit.states)
        refit = fit is None or idx.size - fit.n_obs >= self.refit_every
        gps = []
        for k, y in ((TIME, y_t), (ENERGY, y_e)):
            gp = SingleTaskGP(x, torch.tensor(y, dtype=torch.double).unsqueeze(-1))
            if fit is not None:
                gp.load_state_dict(fit.states[k], strict=False)
            if refit:
                self._fit(gp)
            gps.append(gp.eval())
        if refit:
            states = (_hyperparameters(gps[TIME]), _hyperparameters(gps[ENERGY]))
            self._fits[task.key] = self._last_fit = _Fit(int(idx.size), states)
        return ModelListGP(*gps)

    def _fit(self, gp: SingleTaskGP) -> None:
        """Fit hyperparameters; seeded, since a failed fit retries from random draws."""
        mll = ExactMarginalLogLikelihood(gp.likelihood, gp)
        with warnings.catch_warnings(), torch.random.fork_rng():
            # A capped warm-started fit often stops at maxiter; the result is still usable.
            warnings.simplefilter("ignore", OptimizationWarning)
            torch.manual_seed(self.seed)
            fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": self.fit_maxiter}})

    def curves(self, task: Task) -> Curves:
        """The GPs' posterior log time and log energy ratios at every config, with their s.d.
        (of the curve, not of a new measurement): at measured configs too, where a noisy
        measurement is smoothed by its neighbours."""
        log = self.log(task)
        with torch_threads(self.threads):
            model = self.model(task, log)  # may refit: needs gradients
            with torch.no_grad():
                post = model.posterior(self._x_all)
                mean, sd = post.mean.numpy(), post.variance.clamp_min(0.0).sqrt().numpy()
        return Curves(mean[:, TIME].copy(), sd[:, TIME].copy(), mean[:, ENERGY].copy(), sd[:, ENERGY].copy())

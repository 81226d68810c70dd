"""Per-group sample oracles: draws without replacement, never a record twice, one draw per record."""

import pytest
import torch

from privopt.errors import ConfigError
from privopt.group_sampling import GroupOracles
from privopt.rng import TorchSource


def oracles(groups, seed=0, p=None):
    g = torch.as_tensor(groups)
    return GroupOracles(g, num_groups=p or int(g.max()) + 1, rng=TorchSource(seed=seed))


def test_draws_cover_each_group_exactly_once_without_repeats():
    g = torch.randint(0, 3, (500,), generator=torch.Generator().manual_seed(1))
    o = oracles(g)
    seen = []
    for i in range(3):
        while not o.exhausted(i):
            idx = o.draw(i, width=min(0.07, o.remaining(i)))
            assert bool((g[idx] == i).all())
            seen.append(idx)
    allidx = torch.cat(seen)
    assert allidx.numel() == 500 and allidx.unique().numel() == 500  # every record once, none twice
    assert bool(o.drawn_mask().all())


def test_a_draw_beyond_what_remains_is_refused_and_nothing_is_reused():
    o = oracles([0] * 10 + [1] * 10)
    o.draw(0, width=0.6)
    with pytest.raises(ConfigError, match="exhausted"):
        o.draw(0, width=0.6)
    o.draw(0, width=0.4)
    assert o.exhausted(0) and not o.exhausted(1)
    assert int(o.drawn_mask()[:10].sum()) == 10 and int(o.drawn_mask()[10:].sum()) == 0
    with pytest.raises(ConfigError, match="width"):
        o.draw(1, width=0.0)


def test_keys_give_uniform_random_order_and_expected_sizes():
    # A draw of width w holds Binomial(n, w) records: mean w·n over many seeds.
    sizes = [oracles([0] * 1000, seed=s).draw(0, width=0.1).numel() for s in range(40)]
    assert 90 < sum(sizes) / len(sizes) < 110
    whole = [oracles([0] * 5, seed=s).draw(0, width=1.0) for s in range(50)]
    assert all(sorted(w.tolist()) == [0, 1, 2, 3, 4] for w in whole)


def test_add_remove_neighbour_changes_exactly_one_draw_by_that_record():
    # Same keys for the shared records (coupled randomness): removing record r changes only the
    # draw whose interval holds r's key, and only by r. This is what makes disjoint releases
    # compose in parallel under add/remove neighbours.
    n = 300
    g = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(3))
    keys = torch.rand(n, generator=torch.Generator().manual_seed(4), dtype=torch.float64)

    class FixedKeys(TorchSource):
        def __init__(self, k):
            super().__init__(seed=0)
            self.k = k

        def uniform(self, shape):
            return self.k.clone()

    full = GroupOracles(g, num_groups=2, rng=FixedKeys(keys))
    removed = 17
    keep = torch.tensor([i for i in range(n) if i != removed])
    nb = GroupOracles(g[keep], num_groups=2, rng=FixedKeys(keys[keep]))
    diffs = 0
    for _ in range(8):
        for i in range(2):
            a = set(full.draw(i, width=0.125).tolist())
            b = {int(keep[j]) for j in nb.draw(i, width=0.125).tolist()}
            if a != b:
                diffs += 1
                assert a - b == {removed} and not b - a
    assert diffs == 1


def test_bad_inputs_fail_clearly():
    with pytest.raises(ConfigError, match="group ids"):
        GroupOracles(torch.tensor([0, 3]), num_groups=2, rng=TorchSource(seed=0))
    with pytest.raises(ConfigError, match="1-D integer"):
        GroupOracles(torch.tensor([0.5]), num_groups=2, rng=TorchSource(seed=0))
    o = oracles([0, 1])
    with pytest.raises(ConfigError, match="group must be"):
        o.draw(2, width=0.5)


def test_state_round_trip_continues_the_same_draws():
    g = torch.randint(0, 2, (100,), generator=torch.Generator().manual_seed(0))
    a = oracles(g, seed=5)
    a.draw(0, width=0.25)
    state = a.state_dict()
    nxt = a.draw(0, width=0.25)
    b = oracles(g, seed=99)
    b.load_state_dict(state)
    assert torch.equal(b.draw(0, width=0.25), nxt)

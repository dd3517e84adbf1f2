"""Tree geometry and shapes: ancestors, children, the walk, static and dynamic tree specs, and
Sequoia's dynamic programme against brute force."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decoding.registry import DecodingConfig, make_strategy, require_used
from specjax.decoding.shapes.chain import Chain
from specjax.decoding.shapes.dynamic_tree import DynamicTree
from specjax.decoding.shapes.shape_options import shape_for
from specjax.decoding.shapes.static_tree import StaticTree
from specjax.decoding.shapes.tree import ancestor_matrix, children_table, tree_layout, walk
from specjax.tools.tree_search import Sequoia


def _ancestors_by_hand(parents):
    size = len(parents) + 1
    out = np.eye(size, dtype=bool)
    out[:, 0] = True
    for node, parent in enumerate(parents):
        while parent >= 0:
            out[node + 1, parent + 1] = True
            parent = parents[parent]
    return out


def test_ancestor_matrix_matches_following_parents():
    """Catches too few squarings (deep ancestors missing) or a transposed relation."""
    rng = np.random.default_rng(1)
    for size in (1, 2, 7, 20):
        parents = np.array([[rng.integers(-1, i) for i in range(size)] for _ in range(3)])
        got = np.asarray(ancestor_matrix(jnp.asarray(parents, jnp.int32)))
        for b in range(3):
            np.testing.assert_array_equal(got[b], _ancestors_by_hand(list(parents[b])))
    chain = jnp.arange(12)[None] - 1  # depth 12: needs every squaring
    assert bool(ancestor_matrix(chain)[0, 12, 1])


def test_tree_layout_positions_and_mask():
    parents = jnp.asarray([[-1, 0, -1, 1]])
    layout = tree_layout(jnp.asarray([3]), ancestor_matrix(parents), max_len=10)
    assert layout.slots.tolist() == [[3, 4, 5, 6, 7]]
    assert layout.positions.tolist() == [[3, 4, 5, 4, 6]]  # length + depth
    visible = np.asarray(layout.mask[0])
    assert visible[:, :3].all() and not visible[:, 8:].any()
    assert visible[4].tolist()[3:8] == [True, True, True, False, True]  # node 3: root, 0, 1, 3
    assert visible[3].tolist()[3:8] == [True, False, False, True, False]  # node 2 skips 0, 1


def test_children_table_lists_children_in_index_order():
    parents = jnp.asarray([[-1, 0, -1, 0, 0, 2]])
    table = children_table(parents, 3).tolist()[0]
    assert table[0] == [0, 2, -1]          # the pending token's children
    assert table[1] == [1, 3, 4]           # node 0's
    assert table[3] == [5, -1, -1] and table[2] == [-1, -1, -1]


def test_walk_follows_accepted_children_and_pads_with_identity():
    accepted = jnp.asarray([[1, -1, 3, -1, -1], [-1, 0, 0, 0, 0]])  # per position
    path, count, last = walk(accepted, 3)
    assert count.tolist() == [2, 0] and last.tolist() == [4, 0]  # node 3 sits at position 4
    assert path.tolist() == [[1, 3, 2], [0, 1, 2]]


def test_static_tree_from_branching_and_properties():
    tree = StaticTree.from_branching((2, 2, 1, 1))
    assert tree.parents == (-1, -1, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert (tree.num_nodes, tree.depth, tree.max_children) == (14, 4, 2)
    assert tree.leaves.tolist() == [11, 12, 13, 14]
    assert tree.label() == "tree 2,2,1,1"
    assert [len(p) for p, _ in tree.expansions] == [1, 2, 4, 4]


def test_a_rounds_seconds_add_its_passes_and_sequoias_costs_price_them():
    """2,2,1,1 drafts on 1, 2, 4 and 4 nodes, runs the drafter's layers on its 4 leaves in
    verification and verifies 15 tokens: with passes costing 1, 10 and 100 s a token, its
    round is 11 x 11 + 10 x 4 + 100 x 15; Sequoia's `Costs` add the loop's overhead to the
    same round, its drafter's passes measured on n tokens. Catches the leaves left out of
    the verification, the pending token left out of it, and a draft pass run on the
    leaves too."""
    from specjax.tools.tree_search import Costs

    tree = StaticTree.from_branching((2, 2, 1, 1))
    assert tree.round_from_passes(lambda n: 11.0 * n, lambda n: 10.0 * n,
                              lambda n: 100.0 * n) == 11 * 11 + 10 * 4 + 100 * 15
    costs = Costs(shallow=np.arange(20.0), deep=100 * np.arange(20.0), overhead=0.5,
                  ar_step=1.0)
    assert costs.tree_round(tree) == (1 + 2 + 4 + 4) + 4 + 100 * 15 + 0.5


def test_static_tree_from_parents_renumbers_level_by_level():
    """Children keep their order among siblings (their rank) after renumbering."""
    tree = StaticTree.from_parents([-1, 0, -1, 1, 2, 2, 0])
    assert tree.parents == (-1, -1, 0, 1, 1, 0, 2)  # old nodes 0 2 | 1 4 5 6 | 3
    assert tree.child_lists[1] == [3, 6]  # old node 0's children 1, 6 keep their order
    assert tree.label() == "tree T=7 D=3"
    tree.validate()
    with pytest.raises(ValueError, match="level order"):
        StaticTree((-1, 0, -1)).validate()
    with pytest.raises(ValueError, match="node 1 has parent 1"):
        StaticTree.from_parents([-1, 1])


def test_static_tree_parse_accepts_branching_lists_and_files(tmp_path):
    assert StaticTree.parse("2,1").parents == (-1, -1, 0, 1)
    assert StaticTree.parse("[-1, 0, 0]").parents == (-1, 0, 0)
    path = tmp_path / "tree.json"
    path.write_text(json.dumps({"parents": [-1, -1, 0]}))
    assert StaticTree.parse(str(path), "iid") == StaticTree((-1, -1, 0), "iid")
    for spec, message in [("2,x", "children per depth"), ("[1, 2", "not valid JSON"),
                          ('{"p": 1}', "children per depth"), ("2,0", "needs >= 1 child")]:
        with pytest.raises(ValueError, match=message):
            StaticTree.parse(spec)
    with pytest.raises(ValueError, match="children='x' must be one of"):
        StaticTree.parse("2", "x").validate()


def test_dynamic_tree_budget_is_validated():
    DynamicTree(16, 4, 4).validate()
    with pytest.raises(ValueError, match=r"tree_nodes=12 must lie in \[13, 52\]"):
        DynamicTree(12, 4, 4).validate()
    with pytest.raises(ValueError, match="depth=1 >= 2"):
        DynamicTree(4, 2, 1).validate()


def test_the_registry_builds_chains_and_trees_from_options():
    """Catches a chain's confidence stop, stored by learn_then_test.py as the checkpoint's default,
    making every tree fail ("set it to 0" for a value the user never gave; the fourth probe),
    and a bad tree accepted into a config (it failed only when decoding from the checkpoint)."""
    options = DecodingConfig(exit_layer=2, num_draft=5, draft_threshold=0.3)
    assert shape_for(options) == Chain(5, 0.3)
    tree = DecodingConfig(exit_layer=2, tree="dynamic", tree_nodes=9, tree_top_k=2,
                          tree_depth=3)
    assert make_strategy("selfspec", tree).label() == "selfspec E=2 dynamic T=9 k=2 D=3"
    assert make_strategy("ar", tree).label() == "ar"
    static = DecodingConfig(tree="3,1", tree_children="iid")
    assert shape_for(static) == StaticTree.from_branching((3, 1), "iid")
    with pytest.raises(ValueError, match="unknown strategy 'x'"):
        make_strategy("x", options)
    # A chain's confidence stop stored as a default (learn_then_test.py --write) does not apply to a
    # tree; given by the user with one, it is refused as unused.
    assert shape_for(DecodingConfig(tree="2,2", draft_threshold=0.4)) == shape_for(
        DecodingConfig(tree="2,2"))
    with pytest.raises(ValueError, match="--draft_threshold is not used by strategy selfspec"):
        require_used(["selfspec"], [DecodingConfig(tree="2,2", draft_threshold=0.4)],
                     ["draft_threshold"])
    with pytest.raises(ValueError, match="resolved from measurements"):
        shape_for(DecodingConfig(tree="auto"))
    for spec, message in (("abc", "expected children per depth"), ("2,0", "child per node"),
                          ("nope/t.json", "no such file")):
        with pytest.raises(ValueError, match=f"decoding.tree='{spec}' is not a tree: .*{message}"):
            DecodingConfig(tree=spec).check(None)


def _all_trees(size, depth, ranks):
    """Every tree of `size` positions with depth <= depth and at most `ranks` children per
    node (ordered: a child's rank is its index among its siblings), as nested lists."""
    if size == 1:
        return [[]]
    if depth == 0:
        return []
    out = []

    def splits(remaining):
        if remaining == 0:
            yield []
            return
        for s in range(1, remaining + 1):
            for rest in splits(remaining - s):
                yield [s, *rest]

    for sizes in splits(size - 1):
        if len(sizes) > ranks:
            continue
        options = [[]]
        for s in sizes:
            options = [o + [t] for o in options for t in _all_trees(s, depth - 1, ranks)]
        out.extend(options)
    return out


def _value(tree, acceptance):
    return 1 + sum(acceptance[r] * _value(child, acceptance) for r, child in enumerate(tree))


def test_sequoia_finds_the_best_tree_by_brute_force():
    """Catches a recurrence that counts the root twice, drops a rank or mis-splits sizes; the
    tree it returns must have the value it claims."""
    acceptance = [0.55, 0.2, 0.1, 0.0]  # a rank never accepted must not break the programme
    programme = Sequoia(acceptance, 7, 4)
    for size in range(2, 8):
        for depth in range(1, 5):
            trees = _all_trees(size, depth, len(acceptance))
            if not trees:
                assert programme.tree(size, depth) is None
                continue
            brute = max(_value(t, acceptance) for t in trees)
            value, parents = programme.tree(size, depth)
            assert value == pytest.approx(brute)
            tree = StaticTree.from_parents(parents)
            assert tree.num_nodes == size - 1 and tree.depth <= depth
            assert _value(_nested(tree, 0), acceptance) == pytest.approx(value)


def _nested(tree, position):
    return [_nested(tree, child) for child in tree.child_lists[position]]

"""The entry tree: children, leaves, roots, paths, and the resume rule of RFC 0001 "File"."""

from __future__ import annotations

import pytest

from agentsession_cas import Header, NoSuchEntryError, ParentRef, SessionBuilder, Tree, make_entry, read_session_bytes

_n = 0


def ts() -> str:
    """A fresh ts per entry, so no two entries built here are one entry."""
    global _n
    _n += 1
    return f"2026-10-05T11:{_n // 60 % 60:02d}:{_n % 60:02d}.{_n // 3600 + 1}Z"


def E(parent, text="x", type_="item", **body):
    return make_entry(type_, parent.id if hasattr(parent, "id") else parent, ts=ts(), item={"text": text}, **body)


def mark(parent, target):
    """A `leaf` label hung from ``parent`` naming ``target`` (an entry, an id, or None)."""
    t = target.id if hasattr(target, "id") else target
    return make_entry("label", parent.id if hasattr(parent, "id") else parent, ts=ts(), target=t, label="leaf")


def clear(parent, target):
    t = target.id if hasattr(target, "id") else target
    return make_entry("label", parent.id, ts=ts(), target=t, label=None)


def ids(entries):
    return [e.id for e in entries]


# -- structure -------------------------------------------------------------------


def test_children_in_file_order():
    r = E(None, "root")
    a, b, c = E(r, "a"), E(r, "b"), E(r, "c")
    a1 = E(a, "a1")
    t = Tree([r, a, b, a1, c])
    assert ids(t.children(r.id)) == ids([a, b, c])
    assert ids(t.children(a.id)) == ids([a1])
    assert t.children(c.id) == []
    assert ids(t.children(None)) == ids([r])
    # order is the file's, not the ts's or the ids'
    t2 = Tree([r, c, b, a, a1])
    assert ids(t2.children(r.id)) == ids([c, b, a])


def test_leaves_and_roots():
    r1 = E(None, "r1")
    a = E(r1, "a")
    b = E(r1, "b")
    r2 = E(None, "r2")
    orphan = E("sha256:" + "9" * 64, "orphan")
    t = Tree([r1, a, r2, b, orphan])
    assert ids(t.leaves()) == ids([a, r2, b, orphan])
    assert ids(t.roots()) == ids([r1, r2, orphan])
    assert len(t) == 5
    assert a.id in t and "sha256:" + "9" * 64 not in t
    assert t.get(a.id) is a and t.get("nope") is None


def test_path_follows_parent_alone():
    r = E(None, "r")
    a = E(r, "a")
    side = E(r, "side")
    b = make_entry("item", a.id, ts=ts(), parents=[ParentRef(side.id)], item={"text": "b"})
    t = Tree([r, a, side, b])
    assert ids(t.path(b.id)) == ids([r, a, b])  # `parents` never widens a path
    assert ids(t.path(r.id)) == ids([r])
    assert t.is_ancestor(r.id, b.id) and t.is_ancestor(b.id, b.id)
    assert not t.is_ancestor(side.id, b.id)
    assert t.is_ancestor(None, b.id)
    with pytest.raises(NoSuchEntryError):
        t.path("sha256:" + "0" * 64)


def test_path_stops_at_a_parent_the_tree_lacks():
    a = E("sha256:" + "1" * 64, "a")
    b = E(a, "b")
    assert ids(Tree([a, b]).path(b.id)) == ids([a, b])


# -- the resume rule: no label -------------------------------------------------------------


def test_empty_tree_has_no_leaf():
    assert Tree([]).resume_leaf() is None
    assert Tree([]).leaf_label_in_force() is None


def test_no_label_the_last_entry():
    r = E(None)
    a = E(r)
    b = E(a)
    side = E(r)  # a branch off the root, written last
    assert Tree([r, a, b]).resume_leaf() == b.id
    assert Tree([r, a, b, side]).resume_leaf() == side.id


def test_non_leaf_labels_move_nothing():
    r = E(None)
    a = E(r)
    cp = make_entry("label", a.id, ts=ts(), target=r.id, label="checkpoint")
    b = E(r)
    t = Tree([r, a, cp, b])
    assert t.leaf_label_in_force() is None
    assert t.resume_leaf() == b.id
    # the non-leaf label itself is an entry like any other when it is last
    assert Tree([r, a, cp]).resume_leaf() == cp.id


# -- the resume rule: a leaf label in force ----------------------------------------------


def test_label_target_with_nothing_after_is_the_leaf():
    r = E(None)
    a = E(r)
    b = E(a)
    side = E(r)
    m = mark(side, a)
    t = Tree([r, a, b, side, m])
    assert t.leaf_label_in_force() is m
    # b descends from a but was written before the label: the target is the leaf
    assert t.resume_leaf() == a.id


def test_newest_descendant_written_after_the_label():
    r = E(None)
    a = E(r)
    side = E(r)
    m = mark(side, a)
    a1 = E(a)
    a2 = E(a1)
    a_alt = E(a)  # a branch under a, newer still
    assert Tree([r, a, side, m, a1, a2]).resume_leaf() == a2.id
    assert Tree([r, a, side, m, a1, a2, a_alt]).resume_leaf() == a_alt.id


def test_the_label_itself_is_excepted():
    # marking an ancestor of the leaf hangs the label below the target
    r = E(None)
    a = E(r)
    b = E(a)
    m = mark(b, a)
    t = Tree([r, a, b, m])
    assert t.resume_leaf() == a.id
    # and an entry appended under the target after it is the leaf
    c = E(a)
    assert Tree([r, a, b, m, c]).resume_leaf() == c.id


def test_branch_appended_elsewhere_does_not_move_the_leaf():
    r = E(None)
    a = E(r)
    b = E(r)
    m = mark(b, a)
    a1 = E(a)
    b1 = E(b)  # the abandoned branch goes on, written last
    r2 = E(None)  # and a new root, later still
    t = Tree([r, a, b, m, a1, b1, r2])
    assert t.resume_leaf() == a1.id
    assert t.entries[-1] is r2


def test_the_last_label_in_force_wins():
    r = E(None)
    a = E(r)
    b = E(r)
    m1 = mark(b, a)
    a1 = E(a)
    m2 = mark(a1, b)
    a2 = E(a1)  # the first marked branch extended after the second label
    t = Tree([r, a, b, m1, a1, m2, a2])
    assert t.leaf_label_in_force() is m2
    assert t.resume_leaf() == b.id


def test_label_cleared_by_a_later_null_label_on_the_same_target():
    r = E(None)
    a = E(r)
    b = E(r)
    m = mark(b, a)
    c = clear(m, a)
    t = Tree([r, a, b, m, c])
    assert t.leaf_label_in_force() is None
    assert t.resume_leaf() == c.id  # the last entry again


def test_clearing_falls_back_to_an_earlier_label_still_in_force():
    r = E(None)
    a = E(r)
    b = E(r)
    m1 = mark(b, a)
    a1 = E(a)
    m2 = mark(b, b)
    c = clear(m2, b)  # hung off b's side, so not a descendant of a
    t = Tree([r, a, b, m1, a1, m2, c])
    assert t.leaf_label_in_force() is m1
    assert t.resume_leaf() == a1.id
    # records hung under the marked branch are descendants like any other entry
    c2 = clear(a1, b)
    assert Tree([r, a, b, m1, a1, m2, c2]).resume_leaf() == c2.id


def test_clearing_another_target_clears_nothing():
    r = E(None)
    a = E(r)
    b = E(r)
    m = mark(b, a)
    c = clear(m, b)
    t = Tree([r, a, b, m, c])
    assert t.leaf_label_in_force() is m
    assert t.resume_leaf() == a.id


def test_clear_before_the_label_does_not_clear_it():
    r = E(None)
    a = E(r)
    b = E(r)
    c = clear(b, a)
    m = mark(c, a)
    assert Tree([r, a, b, c, m]).resume_leaf() == a.id


# -- labels not in force -------------------------------------------------------------------


def test_label_whose_target_is_absent_is_not_in_force():
    r = E(None)
    a = E(r)
    b = E(r)
    m = mark(b, "sha256:" + "5" * 64)
    x = E(b)
    t = Tree([r, a, b, m, x])
    assert t.leaf_label_in_force() is None
    assert t.resume_leaf() == x.id


@pytest.mark.parametrize("target", [5, ["sha256:" + "0" * 64], {"entry": "x"}, True])
def test_label_whose_target_is_not_an_id_is_not_in_force(target):
    r = E(None)
    a = E(r)
    m = make_entry("label", a.id, ts=ts(), target=target, label="leaf")
    b = E(r)
    t = Tree([r, a, m, b])
    assert t.leaf_label_in_force() is None
    assert t.resume_leaf() == b.id


def test_label_whose_target_is_itself_a_leaf_label_is_not_in_force():
    r = E(None)
    a = E(r)
    b = E(r)
    m1 = mark(b, "sha256:" + "5" * 64)  # not in force itself
    m2 = mark(m1, m1)
    x = E(a)
    t = Tree([r, a, b, m1, m2, x])
    assert t.leaf_label_in_force() is None
    assert t.resume_leaf() == x.id


def test_label_on_the_prefix_above_the_base_is_not_in_force():
    p0 = E(None, "p0")
    p1 = E(p0, "p1")
    base = E(p1, "base")
    own = E(base, "own")
    m_prefix = mark(own, p1)
    own2 = E(own, "own2")
    entries = [p0, p1, base, own, m_prefix, own2]
    t = Tree(entries, base=base.id, prefix=[p0.id, p1.id])
    assert t.leaf_label_in_force() is None
    assert t.resume_leaf() == own2.id
    # the base itself is not above the base: a label may rest on it
    m_base = mark(own2, base)
    t = Tree(entries + [m_base], base=base.id, prefix=[p0.id, p1.id])
    assert t.leaf_label_in_force() is m_base
    assert t.resume_leaf() == base.id


def test_null_target_in_a_baseless_file_is_the_universal_root():
    r = E(None)
    a = E(r)
    m = mark(a, None)
    t = Tree([r, a, m])
    assert t.leaf_label_in_force() is m
    assert t.resume_leaf() is None
    # anything written after it descends from the universal root
    r2 = E(None)
    assert Tree([r, a, m, r2]).resume_leaf() == r2.id
    r2a = E(r2)
    assert Tree([r, a, m, r2, r2a]).resume_leaf() == r2a.id


def test_null_target_in_a_based_file_is_not_in_force():
    p0 = E(None, "p0")
    base = E(p0, "base")
    own = E(base, "own")
    m = mark(own, None)
    t = Tree([p0, base, own, m], base=base.id, prefix=[p0.id])
    assert t.leaf_label_in_force() is None
    # the last entry is that label, which resolves to its nearest ancestor that is not one
    assert t.resume_leaf() == own.id


# -- a leaf that is itself a leaf label -------------------------------------------------------------


def test_found_leaf_label_resolves_to_its_nearest_ancestor_that_is_not_one():
    r = E(None)
    a = E(r)
    side = E(r)
    m = mark(side, a)
    a1 = E(a)
    stray = mark(a1, "sha256:" + "7" * 64)  # a leaf label, not in force, the newest descendant
    t = Tree([r, a, side, m, a1, stray])
    assert t.leaf_label_in_force() is m
    assert t.resume_leaf() == a1.id
    # through a chain of them
    stray2 = mark(stray, "sha256:" + "8" * 64)
    assert Tree([r, a, side, m, a1, stray, stray2]).resume_leaf() == a1.id


def test_last_line_a_leaf_label_not_in_force_resolves_upward():
    r = E(None)
    a = E(r)
    m = mark(a, "sha256:" + "6" * 64)
    assert Tree([r, a, m]).resume_leaf() == a.id


def test_leaf_labels_all_the_way_up_give_the_universal_root():
    m = mark(None, "sha256:" + "6" * 64)
    assert Tree([m]).resume_leaf() is None


# -- the same, through a file ----------------------------------------------------------------------


def test_sessionfile_tree_knows_its_prefix():
    origin = SessionBuilder(Header.new("0199d000-0000-7000-8000-000000000001", created_at="2026-10-05T11:00:00Z"))
    for _ in range(4):
        origin.append("item", ts=ts(), item={"n": 1})
    base = origin.entries[2]
    fork = SessionBuilder(
        Header.new("0199d000-0000-7000-8000-000000000002", created_at="2026-10-05T12:00:00Z", base=base.id),
        prefix=origin.entries[:3],
    )
    own = fork.append("item", ts=ts(), item={"n": 2})
    fork.mark_leaf(origin.entries[1].id, ts=ts())  # a label on the prefix: not in force
    s = read_session_bytes(fork.to_bytes())
    assert s.all_problems() == []
    assert s.tree.prefix == frozenset(ids(origin.entries[:2]))
    assert s.tree.base == base.id
    assert s.tree.leaf_label_in_force() is None
    assert s.leaf == own.id


def test_sessionfile_tree_without_the_base_has_no_prefix():
    b = SessionBuilder(Header.new("0199d000-0000-7000-8000-000000000003", created_at="2026-10-05T11:00:00Z", base="sha256:" + "c" * 64))
    b.branch(None, "item", ts=ts(), item={"n": 1})
    s = read_session_bytes(b.to_bytes())
    assert s.tree.prefix == frozenset()


def test_leaf_label_without_a_target_member_is_not_in_force():
    from agentsession_cas import Header, SessionBuilder, make_entry, read_session_bytes

    b = SessionBuilder(Header.new("t-no-target", created_at="2026-10-05T12:00:00Z"))
    first = b.append("item", ts="2026-10-05T12:00:01Z", item={"n": 1})
    b.append("item", ts="2026-10-05T12:00:02Z", item={"n": 2})
    label = make_entry("label", b.leaf, ts="2026-10-05T12:00:03Z", label="leaf")  # no target at all
    data = b.to_bytes() + label.canonical_line()
    sf = read_session_bytes(data)
    assert sf.tree.leaf_label_in_force() is None
    assert sf.leaf == b.leaf != first.id

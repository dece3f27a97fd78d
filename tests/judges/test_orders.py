"""Balanced presentation orders: each candidate once at each position, drawn per key."""

from components.judges.orders import balanced_orders, drawn_order


def test_balanced_orders_form_a_latin_square_of_one_drawn_order():
    for n in (1, 2, 3, 4, 5):
        orders = balanced_orders("7:2:q1", n)
        assert len(orders) == n and all(sorted(o) == list(range(n)) for o in orders)
        for position in range(n):  # every candidate shown once at every position
            assert sorted(o[position] for o in orders) == list(range(n))
        assert orders[0] == drawn_order("7:2:q1", n)


def test_drawn_order_depends_on_the_key_only():
    assert drawn_order("a", 6) == drawn_order("a", 6)
    assert len({tuple(drawn_order(f"k{i}", 6)) for i in range(10)}) > 1

"""The template parser's edges: a hole with a quote on one side only is not a JSON string body (a schema fits there),
a hole name cut off by the template's end is an unbalanced hole, and a `parallel` group of one hole is refused.
h90's mutation audit (P25, P27, P26): each of these passed every programs test with its check changed."""

from __future__ import annotations

import pytest

from hf_paged import programs as hp
from hf_paged.programs.template import parallel_groups, parse_template


@pytest.mark.parametrize("template", ['"[x] y', '[x]" y', '{"a": [x]}'])
def test_a_quote_on_one_side_only_is_not_a_string_body(template):
    plan = parse_template(template, {"x": hp.schema({"type": "integer"})})  # a string body would refuse a schema
    assert [h.json_string for h in plan.holes] == [False]


def test_a_hole_between_quotes_is_a_string_body():
    (hole,) = parse_template('{"a": "[x]"}', {"x": hp.regex("[a-z]+")}).holes
    assert hole.json_string


@pytest.mark.parametrize("template", ["x [name", "[name"])
def test_a_hole_name_cut_off_by_the_end_is_unbalanced(template):
    with pytest.raises(hp.TemplateError, match=r"unbalanced hole .*'\[name' has no closing '\]'"):
        parse_template(template, {"name": ["a", "b"]})


def test_a_parallel_group_needs_two_holes():
    plan = parse_template("[s1] and [s2]", {"s1": ["a"], "s2": ["b"]})
    assert parallel_groups(plan, [["s1", "s2"]]) == {0: 1}
    with pytest.raises(hp.TemplateError, match="two or more"):
        parallel_groups(plan, [["s1"]])

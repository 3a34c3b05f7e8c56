"""The gateway's `/metrics` merge: labels, grouping and escaping, on hand-written expositions (no Ray)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hf_paged.scaleout.metrics_merge import (
    MetricFamily,
    ReplicaMetrics,
    escape_label_value,
    merge_expositions,
    parse_exposition,
    render_scrape,
    with_label,
)

A = """\
# HELP m_running Requests running
# TYPE m_running gauge
m_running{model_name="x"} 1.0
# HELP m_ttft Time to first token
# TYPE m_ttft histogram
m_ttft_bucket{le="0.1",model_name="x"} 0.0
m_ttft_bucket{le="+Inf",model_name="x"} 2.0
m_ttft_count{model_name="x"} 2.0
m_ttft_sum{model_name="x"} 0.5
"""
B = """\
# HELP m_running Requests running
# TYPE m_running gauge
m_running{model_name="x"} 3.0
# HELP m_only_b A family replica b alone has
# TYPE m_only_b counter
m_only_b_total 7.0
# HELP m_ttft Time to first token
# TYPE m_ttft histogram
m_ttft_bucket{le="0.1",model_name="x"} 1.0
m_ttft_bucket{le="+Inf",model_name="x"} 1.0
m_ttft_count{model_name="x"} 1.0
m_ttft_sum{model_name="x"} 0.05
"""


def test_with_label_adds_to_any_label_set():
    assert with_label('name{a="b"} 1', "replica", "r1") == 'name{a="b",replica="r1"} 1'
    assert with_label("name 1", "replica", "r1") == 'name{replica="r1"} 1'
    assert with_label("name{} 1 1700000000", "replica", "r1") == 'name{replica="r1"} 1 1700000000'
    assert with_label('h_bucket{le="+Inf",m="x",} 4.0', "replica", "r") == 'h_bucket{le="+Inf",m="x",replica="r"} 4.0'
    # a value holding the characters that end a label set is read through its escapes
    tricky = r'name{a="x}\",y=\\",b="2"} 1'
    assert with_label(tricky, "replica", "r") == r'name{a="x}\",y=\\",b="2",replica="r"} 1'
    # a clashing label is kept under exported_ (as Prometheus renames a clashing target label)
    assert with_label('name{replica="old"} 1', "replica", "new") == 'name{exported_replica="old",replica="new"} 1'


def test_replica_ids_are_escaped():
    assert escape_label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    line = with_label("name 1", "replica", 'we"ird\\id')
    assert line == 'name{replica="we\\"ird\\\\id"} 1'
    [family] = text_string_to_metric_families(line + "\n")
    assert family.samples[0].labels == {"replica": 'we"ird\\id'}  # the official parser reads the id back


@pytest.mark.parametrize("bad", ["{a=\"b\"} 1", 'name{a="b} 1', "name{a} 1", 'name{a="b"}', "name"])
def test_malformed_samples_are_refused(bad):
    with pytest.raises(ValueError):
        parse_exposition(bad)


def test_parse_groups_samples_under_their_family():
    families = parse_exposition(A + "# a plain comment\n\nlonely 2\n")
    assert [(f.name, f.type, len(f.samples)) for f in families] == [
        ("m_running", "gauge", 1), ("m_ttft", "histogram", 4), ("lonely", None, 1)]
    assert families[2].lines() == ["lonely 2"]


def test_merge_keeps_one_help_type_per_family_and_every_replicas_samples():
    text = merge_expositions({"rb": parse_exposition(B), "ra": parse_exposition(A)})
    lines = text.splitlines()
    assert lines == [
        "# HELP m_running Requests running",
        "# TYPE m_running gauge",
        'm_running{model_name="x",replica="ra"} 1.0',
        'm_running{model_name="x",replica="rb"} 3.0',
        "# HELP m_ttft Time to first token",
        "# TYPE m_ttft histogram",
        'm_ttft_bucket{le="0.1",model_name="x",replica="ra"} 0.0',
        'm_ttft_bucket{le="+Inf",model_name="x",replica="ra"} 2.0',
        'm_ttft_count{model_name="x",replica="ra"} 2.0',
        'm_ttft_sum{model_name="x",replica="ra"} 0.5',
        'm_ttft_bucket{le="0.1",model_name="x",replica="rb"} 1.0',
        'm_ttft_bucket{le="+Inf",model_name="x",replica="rb"} 1.0',
        'm_ttft_count{model_name="x",replica="rb"} 1.0',
        'm_ttft_sum{model_name="x",replica="rb"} 0.05',
        "# HELP m_only_b A family replica b alone has",
        "# TYPE m_only_b counter",
        'm_only_b_total{replica="rb"} 7.0',
    ]
    # the same answer whatever order the replicas answered in
    assert text == merge_expositions({"ra": parse_exposition(A), "rb": parse_exposition(B)})
    families = {f.name: f for f in text_string_to_metric_families(text)}
    buckets = [s for s in families["m_ttft"].samples if s.name == "m_ttft_bucket"]
    assert {s.labels["replica"] for s in buckets} == {"ra", "rb"}


def test_merge_of_real_client_output_reads_back():
    texts = {}
    for replica, n in (("r1", 1), ("r2", 2)):
        registry = CollectorRegistry()
        success = Counter("hf_paged:request_success", 'Finished "requests" \\ by reason',
                          ["model_name", "finished_reason"], registry=registry)
        success.labels("m", "stop").inc(n)
        Histogram("hf_paged:ttft_seconds", "ttft", ["model_name"], buckets=(0.1,), registry=registry) \
            .labels("m").observe(0.01 * n)
        texts[replica] = parse_exposition(generate_latest(registry).decode())
    text = merge_expositions(texts)
    assert text.count("# TYPE hf_paged:request_success_total counter") == 1
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["hf_paged:request_success"].documentation == 'Finished "requests" \\ by reason'
    totals = {s.labels["replica"]: s.value for s in families["hf_paged:request_success"].samples
              if s.name.endswith("_total")}
    assert totals == {"r1": 1.0, "r2": 2.0}
    counts = {s.labels["replica"]: s.value for s in families["hf_paged:ttft_seconds"].samples
              if s.name.endswith("_count")}
    assert counts == {"r1": 1.0, "r2": 1.0}


def test_render_scrape_counts_what_is_missing():
    results = [ReplicaMetrics("r1", A), TimeoutError("slow"), ReplicaMetrics("r2", 'broken{ 1\n'),
               ReplicaMetrics("r3", B)]
    text = render_scrape(results, routed={"affinity": 5, "load": 1})
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["hf_paged:metrics_replicas_scraped"].samples[0].value == 2
    assert families["hf_paged:metrics_scrape_errors"].samples[0].value == 2
    assert {s.labels["replica"] for s in families["m_running"].samples} == {"r1", "r3"}
    routed = {s.labels["reason"]: s.value for s in families["hf_paged:router_requests_routed"].samples}
    assert routed == {"affinity": 5, "load": 1}
    assert all("replica" not in s.labels for s in families["hf_paged:metrics_scrape_errors"].samples)
    nothing = render_scrape([RuntimeError("no replica")])  # nothing answered: still a valid answer
    assert "hf_paged:metrics_scrape_errors 1.0" in nothing and "router" not in nothing


def test_own_families_merge_with_a_replica_family_of_the_same_name():
    own = [MetricFamily("m_running", "Requests running", "gauge", ["m_running 9"])]
    text = merge_expositions({"r": parse_exposition(A)}, own)
    assert text.count("# HELP m_running") == 1
    assert 'm_running{model_name="x",replica="r"} 1.0\nm_running 9\n' in text

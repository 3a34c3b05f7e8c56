"""One Prometheus answer from every replica's: the gateway's `/metrics` (pure text work, no Ray, no torch).

    replica A: # HELP m ...        replica B: # HELP m ...         merged:  # HELP m ...
               # TYPE m gauge                 # TYPE m gauge                # TYPE m gauge
               m{model_name="x"} 1            m{model_name="x"} 3           m{model_name="x",replica="A"} 1
                                                                            m{model_name="x",replica="B"} 3
                                                                   + the gateway's own families (no replica label)

The text exposition format (0.0.4) wants each family's lines in one group under a single HELP/TYPE, so samples are
regrouped by family: families in order of first appearance, replicas in id order within a family, each replica's
lines in its own order. A sample that already has a `replica` label keeps it as `exported_replica` (what Prometheus
does with a clashing target label).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "CONTENT_TYPE", "MetricFamily", "ReplicaMetrics", "escape_label_value", "gateway_families", "merge_expositions",
    "parse_exposition", "render_scrape", "with_label",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Sample-name suffixes that belong to the family declared above them (histogram, summary, counter, gauge histogram).
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created", "_gcount", "_gsum", "_info")


@dataclass(frozen=True, slots=True)
class ReplicaMetrics:
    """One replica's answer to a scrape (plain data: it crosses processes pickled)."""

    replica: str  # the replica's id, the value of its `replica` label
    text: str  # its `/metrics` body, the text exposition format


@dataclass(slots=True)
class MetricFamily:
    name: str  # as in the HELP/TYPE lines (for a sample without them: the sample's name)
    help: str | None = None  # the HELP text as exposed (its escapes kept); None: no HELP line
    type: str | None = None  # counter, gauge, histogram, summary, untyped; None: no TYPE line
    samples: list[str] = field(default_factory=list)  # sample lines, verbatim

    def owns(self, sample_name: str) -> bool:
        rest = sample_name[len(self.name):] if sample_name.startswith(self.name) else None
        return rest is not None and (rest == "" or rest in _SUFFIXES)

    def lines(self) -> list[str]:
        head = [] if self.help is None else [f"# HELP {self.name} {self.help}"]
        head += [] if self.type is None else [f"# TYPE {self.name} {self.type}"]
        return head + self.samples


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_exposition(text: str) -> list[MetricFamily]:
    """The families of a text exposition, in order. Comments other than HELP/TYPE are dropped; a sample that no
    family above owns starts an untyped one. Raises `ValueError` on a line that is not the format."""
    families: list[MetricFamily] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                continue  # a plain comment (or OpenMetrics' `# EOF` / `# UNIT`)
            name, value = parts[2], parts[3] if len(parts) > 3 else ""
            current = families[-1] if families else None
            slot = "help" if parts[1] == "HELP" else "type"
            if current is None or current.name != name or getattr(current, slot) is not None or current.samples:
                current = MetricFamily(name)
                families.append(current)
            setattr(current, slot, value)
            continue
        sample_name = _split_sample(line, number)[0]
        if not families or not families[-1].owns(sample_name):
            families.append(MetricFamily(sample_name))
        families[-1].samples.append(line)
    return families


def with_label(sample: str, name: str, value: str) -> str:
    """`sample` with `name="value"` appended to its label set (value escaped here); a label already called `name`
    becomes `exported_<name>`."""
    metric, labels, rest = _split_sample(sample)
    pairs = [(f"exported_{key}" if key == name else key, raw) for key, raw in labels]
    pairs.append((name, escape_label_value(value)))
    return metric + "{" + ",".join(f'{key}="{raw}"' for key, raw in pairs) + "}" + rest


def merge_expositions(by_replica: Mapping[str, Sequence[MetricFamily]], own: Sequence[MetricFamily] = (), *,
                      label: str = "replica") -> str:
    """One exposition: each replica's samples with `label="<replica id>"`, then `own` families unlabelled.
    HELP/TYPE come from the first replica (in id order) that declares the family."""
    merged: dict[str, MetricFamily] = {}
    for replica in sorted(by_replica):
        for family in by_replica[replica]:
            target = merged.setdefault(family.name, MetricFamily(family.name, family.help, family.type))
            target.help = target.help if target.help is not None else family.help
            target.type = target.type if target.type is not None else family.type
            target.samples.extend(with_label(sample, label, replica) for sample in family.samples)
    for family in own:
        target = merged.setdefault(family.name, MetricFamily(family.name, family.help, family.type))
        target.samples.extend(family.samples)
    return "".join(line + "\n" for family in merged.values() for line in family.lines())


def gateway_families(*, num_scraped: int, num_failed: int, routed: Mapping[str, int] | None = None,
                     rejected: Mapping[int, int] | None = None) -> list[MetricFamily]:
    """The gateway's own view: replicas in this answer, replicas missing from it, the errors it answered itself
    by status (a replica's are its `request_rejected`), and (cache-aware router only) requests routed by reason."""
    families = [
        MetricFamily("hf_paged:metrics_replicas_scraped", "Replicas whose metrics are in this answer", "gauge",
                     [f"hf_paged:metrics_replicas_scraped {float(num_scraped)}"]),
        MetricFamily("hf_paged:metrics_scrape_errors",
                     "Replicas missing from this answer: failed, timed out or unreadable (1 if no replica answered)",
                     "gauge", [f"hf_paged:metrics_scrape_errors {float(num_failed)}"]),
    ]
    if rejected is not None:
        name = "hf_paged:gateway_requests_rejected_total"
        samples = [f'{name}{{status="{status}"}} {float(n)}' for status, n in sorted(rejected.items())]
        families.append(MetricFamily(name, "Requests the gateway answered with an error itself (401, 503 not ready "
                                     "or draining or no replica left, a refused body), by status", "counter", samples))
    if routed is not None:
        name = "hf_paged:router_requests_routed_total"
        families.append(MetricFamily(name, "Requests the gateway's router placed, by reason", "counter",
                                     [f'{name}{{reason="{escape_label_value(reason)}"}} {float(n)}'
                                      for reason, n in sorted(routed.items())]))
    return families


def render_scrape(results: Sequence[ReplicaMetrics | BaseException], *,
                  routed: Mapping[str, int] | None = None, rejected: Mapping[int, int] | None = None) -> str:
    """The gateway's `/metrics` body from the replicas' answers; an exception or an unreadable text counts as a
    scrape error and leaves that replica out."""
    by_replica: dict[str, list[MetricFamily]] = {}
    failed = 0
    for result in results:
        if not isinstance(result, ReplicaMetrics):
            failed += 1
            continue
        try:
            by_replica[result.replica] = parse_exposition(result.text)
        except ValueError:
            failed += 1
    own = gateway_families(num_scraped=len(by_replica), num_failed=failed, routed=routed, rejected=rejected)
    return merge_expositions(by_replica, own)


# -- the sample grammar ------------------------------------------------------------------------------------------
#   name{label="value",...} value [timestamp]      name value [timestamp]

def _split_sample(line: str, number: int | None = None) -> tuple[str, list[tuple[str, str]], str]:
    """(metric name, [(label, raw escaped value)], the rest from the space before the value on)."""
    where = f"line {number}" if number is not None else "sample"
    end = next((i for i, ch in enumerate(line) if ch == "{" or ch.isspace()), len(line))
    metric = line[:end]
    if not metric:
        raise ValueError(f"{where}: no metric name in {line!r}")
    if end == len(line) or line[end] != "{":
        if not line[end:].strip():
            raise ValueError(f"{where}: no value in {line!r}")
        return metric, [], line[end:]
    labels: list[tuple[str, str]] = []
    i = end + 1
    while True:
        while i < len(line) and line[i] in " \t,":
            i += 1
        if i < len(line) and line[i] == "}":
            if not line[i + 1:].strip():
                raise ValueError(f"{where}: no value in {line!r}")
            return metric, labels, line[i + 1:]
        eq = line.find("=", i)
        key = line[i:eq].strip() if eq > 0 else ""
        if not key or line[eq + 1:].lstrip()[:1] != '"':
            raise ValueError(f"{where}: malformed label set in {line!r}")
        j = line.index('"', eq) + 1
        start = j
        while j < len(line) and line[j] != '"':
            j += 2 if line[j] == "\\" else 1
        if j >= len(line):
            raise ValueError(f"{where}: unterminated label value in {line!r}")
        labels.append((key, line[start:j]))
        i = j + 1

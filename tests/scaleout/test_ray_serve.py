"""End to end on a local Ray cluster (num_cpus=2): 2 engine replicas of the tiny model behind the gateway.

Four tests run by default on one cluster (readiness as the app starts; serving, routing by cache, the router's view;
`/metrics` across replicas; a replica killed mid-stream, last since it leaves Serve replacing the victim); a longer
kill under load is marked slow. The app starts without waiting for its replicas (as `deploy` starts it, but not
blocked on them), and the module's fixture probes it meanwhile until the first 200: what it saw is the readiness
test's (issue 37; the gateway's door without Ray is tests/scaleout/test_ready.py). One cluster and one app start for
both, instead of a second cluster of its own for readiness (~40 s on 2 cores).
"""

from __future__ import annotations

import json
import threading
import time

import pytest

ray = pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port

SYSTEMS = [f"You are assistant number {k}. " + "Answer in one short sentence, kindly and plainly. " * 5
           for k in range(3)]


START_S = 300  # the app's start-up bound: ~40-60 s on 2 loaded cores, past 120 s at load ~20


@pytest.fixture(scope="module")
def started():
    """The app started without waiting for its engine replicas, probed until its first 200: a chat sent before
    readiness (waits in the gateway, bounded, then routed), `/v1/models` polled meanwhile (our 503s counted, with
    their Retry-After and message checked as they come), the router's view and readiness taken at the first 200."""
    from ray import serve
    from ray.serve.api import _run

    from hf_paged.scaleout.deploy import APP_NAME, build_application
    from hf_paged.scaleout.gateway import wait_until_ready
    from hf_paged.scaleout.spec import ReplicaSpec
    from tests.ray_cluster import local_ray

    with local_ray(serve=True):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        spec = ReplicaSpec(paged={"block_size": 16, "num_blocks": 512}, torch_threads=1)
        # Not waiting for the application to run: the gateway is up while the engine replicas still load
        handle = _run(build_application(spec, replicas=2), name=APP_NAME, route_prefix="/", _blocking=False)
        early: dict = {}

        def chat_early() -> None:  # sent before readiness: waits in the gateway (bounded), then routed
            body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}
            deadline = time.monotonic() + START_S
            while time.monotonic() < deadline:
                try:
                    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
                except httpx.HTTPError:
                    time.sleep(0.2)
                    continue
                if r.headers.get("content-type", "").startswith("application/json") and r.status_code != 503:
                    early.update(status=r.status_code, sent=time.monotonic())
                    return
                time.sleep(0.2)  # the proxy before the app exists, or not ready in 30 s

        sender = threading.Thread(target=chat_early, daemon=True)
        sender.start()
        ours_503, bad_503, r = 0, [], None
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            try:
                r = httpx.get(url + "/v1/models", timeout=30)
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            if r.status_code == 200:
                break
            if r.status_code == 503 and r.headers.get("content-type") == "application/json":
                error = r.json()["error"]
                if error.get("code") == "not_ready":  # ours (Serve's proxy answers others before the app exists)
                    if r.headers["retry-after"] != "1" or "engine replicas have reported" not in error["message"]:
                        bad_503.append((dict(r.headers), error))
                    ours_503 += 1
            time.sleep(0.1)
        first = None if r is None else {"status": r.status_code, "json": r.json() if r.status_code == 200 else None}
        view = httpx.get(url + "/hf_paged/router", timeout=30).json() if first and first["status"] == 200 else None
        state = wait_until_ready(handle, 5.0)
        sender.join(timeout=START_S)
        yield {"url": url, "first": first, "view": view, "state": state, "early": early, "ours_503": ours_503,
               "bad_503": bad_503}


@pytest.fixture(scope="module")
def endpoint(started):
    return started["url"]


def test_on_ray_the_first_200_comes_with_every_replica_in_the_router_view(started):
    """Issue 37 on a real cluster: `/v1/models` answers 200 only once the router's view holds both replicas with a
    first report (our 503s before it carry Retry-After: 1 and say so); readiness then holds (2 known, 2 reported);
    the chat sent before readiness waited and was answered."""
    first, view, state = started["first"], started["view"], started["state"]
    assert first is not None, f"the app did not answer within {START_S} s"
    assert first["status"] == 200 and first["json"]["data"][0]["id"] == "hf-paged/tiny-lm", first
    assert not started["bad_503"], started["bad_503"]
    assert len(view) == 1 and len(view[0]["replicas"]) == 2, view
    # The probe was routed: the router took every replica's first report before choosing
    assert all(r["num_reports"] >= 1 for r in view[0]["replicas"].values()), view
    assert state.ready and (state.num_known, state.num_reported) == (2, 2)
    assert started["early"].get("status") == 200, started["early"]
    print(f"not-ready 503s seen before the first 200: {started['ours_503']}")


def chat(client, system: str, question: str, **extra):
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 4, **extra}
    return client.post("/v1/chat/completions", json=body)


def router_view(client) -> dict:
    views = client.get("/hf_paged/router").json()
    assert len(views) == 1
    return views[0]


def test_replicas_serve_the_openai_endpoints_and_route_by_cache(endpoint):
    with httpx.Client(base_url=endpoint, timeout=60) as client:
        homes: dict[int, set[str]] = {k: set() for k in range(len(SYSTEMS))}
        cached = prompt = 0
        for turn in range(3):
            for k, system in enumerate(SYSTEMS):
                r = chat(client, system, f"question {turn}", ignore_eos=True)  # sampled: 4 tokens, no early EOS
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["finish_reason"] == "length"
                homes[k].add(r.headers["x-hf-paged-replica"])
                if turn:
                    usage = r.json()["usage"]
                    cached += usage["prompt_tokens_details"]["cached_tokens"]
                    prompt += usage["prompt_tokens"]
        assert cached / prompt > 0.8, f"repeat prompts found {cached}/{prompt} tokens cached"
        assert all(len(h) == 1 for h in homes.values()), f"a prefix moved between replicas: {homes}"
        stream = chat(client, SYSTEMS[0], "stream it", stream=True)
        assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]")
        assert client.get("/v1/models").json()["data"][0]["id"] == "hf-paged/tiny-lm"
        bad = client.post("/v1/chat/completions", json={"messages": "nope"})
        assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
        deadline = time.monotonic() + 120  # a reporting period or two (longer on a loaded machine)
        while True:  # the router takes the reports when it next routes
            assert chat(client, SYSTEMS[1], "one more").status_code == 200
            view = router_view(client)
            replicas = view["replicas"].values()  # reported, and a report with the prefixes they cached
            reported = len(replicas) == 2 and all(r["num_reports"] >= 1 for r in replicas) \
                and sum(r["num_fingerprints"] for r in replicas) > 0
            if reported or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(view["replicas"]) == 2
        assert all(r["num_reports"] >= 1 for r in view["replicas"].values())
        assert sum(r["num_fingerprints"] for r in view["replicas"].values()) > 0
        assert view["routed"].get("affinity", 0) >= 6


def scrape(client) -> dict:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    assert "x-hf-paged-replica" not in r.headers  # the answer is every replica's, not one's
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def test_metrics_report_every_replica_with_a_replica_label(endpoint):
    with httpx.Client(base_url=endpoint, timeout=60) as client:
        tags = {chat(client, system, "count me").headers["x-hf-paged-replica"] for system in SYSTEMS}
        families = scrape(client)
        replicas = {s.labels["replica"] for s in families["hf_paged:num_requests_running"].samples}
        assert len(replicas) == 2 and tags <= replicas, (tags, replicas)
        assert replicas == set(router_view(client)["replicas"])
        for name in ("hf_paged:time_to_first_token_seconds", "hf_paged:kv_cache_total_blocks"):
            assert {s.labels["replica"] for s in families[name].samples} == replicas
        successes = [s for s in families["hf_paged:request_success"].samples if s.name.endswith("_total")]
        assert sum(s.value for s in successes) >= len(SYSTEMS)
        assert families["hf_paged:metrics_replicas_scraped"].samples[0].value == 2
        assert families["hf_paged:metrics_scrape_errors"].samples[0].value == 0
        assert sum(s.value for s in families["hf_paged:router_requests_routed"].samples) >= len(SYSTEMS)


@pytest.mark.slow
def test_a_killed_replica_loses_no_request_silently(endpoint):
    results: list[tuple[str, str]] = []
    stop = threading.Event()

    def client_loop(worker: int) -> None:
        with httpx.Client(base_url=endpoint, timeout=120) as client:
            i = 0
            while not stop.is_set():
                streamed = i % 2 == 0
                try:
                    r = chat(client, SYSTEMS[worker % len(SYSTEMS)], f"w{worker} q{i}", stream=streamed,
                             max_tokens=24)
                    if r.status_code != 200:
                        results.append(("error", f"{r.status_code}"))
                    elif streamed:
                        ok = r.text.rstrip().endswith("data: [DONE]")
                        results.append(("error" if '"error"' in r.text or not ok else "ok", "stream"))
                    else:
                        json.loads(r.text)["choices"]
                        results.append(("ok", "json"))
                except (httpx.HTTPError, ValueError, KeyError) as exc:  # a cut body or connection: an error seen
                    results.append(("error", type(exc).__name__))
                i += 1

    threads = [threading.Thread(target=client_loop, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    time.sleep(4)
    with httpx.Client(base_url=endpoint, timeout=60) as client:
        before = set(router_view(client)["replicas"])
        victim = min(before)
        kill_replica(victim)
        killed_at = time.time()
        scraped: dict = {}

        def scrape_now() -> None:  # a scrape right after the kill: it must answer, without the dead replica
            with httpx.Client(base_url=endpoint, timeout=30) as other:
                running = scrape(other)["hf_paged:num_requests_running"].samples
            scraped.update(left={s.labels["replica"] for s in running}, seconds=time.time() - killed_at)

        scraper = threading.Thread(target=scrape_now)
        scraper.start()
        forgotten = None
        while time.time() - killed_at < 30:
            known = set(router_view(client)["replicas"])
            if victim not in known and forgotten is None:
                forgotten = time.time() - killed_at
            if forgotten is not None and len(known) == 2:
                break
            time.sleep(0.2)
        time.sleep(3)
    stop.set()
    for t in threads:
        t.join(timeout=150)
    assert not any(t.is_alive() for t in threads), "a request hung"
    assert forgotten is not None and forgotten < 5, f"the router still knew the dead replica {forgotten} s later"
    assert len(known) == 2, f"Serve did not bring a replacement: {known}"
    scraper.join(timeout=30)
    assert scraped.get("seconds", 99) < 10 and scraped["left"] and scraped["left"] <= before, scraped
    outcomes = [o for o, _ in results]
    print(f"killed {victim}: forgotten after {forgotten:.2f} s; {outcomes.count('ok')} complete answers, "
          f"errors {[d for o, d in results if o == 'error']}")
    assert outcomes.count("ok") > 10 and len(outcomes) == outcomes.count("ok") + outcomes.count("error")
    assert outcomes.count("error") <= 4, results  # only what the dead replica was running


def kill_replica(tag: str) -> None:
    name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].endswith(f"#EngineReplica#{tag}"))
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


def test_a_replica_killed_mid_stream_ends_its_answers_with_an_error(endpoint):
    """Short enough to run by default: one long stream pins the victim, two clients keep others coming; the kill
    ends the stream with an error event, every other request is answered or fails visibly, and the scrape right
    after the kill answers without the victim."""
    results: list[str] = []
    stop = threading.Event()

    def client_loop(worker: int) -> None:
        with httpx.Client(base_url=endpoint, timeout=60) as client:
            i = 0
            while not stop.is_set():
                try:
                    r = chat(client, SYSTEMS[worker], f"w{worker} q{i}", stream=i % 2 == 0, max_tokens=8)
                    ok = r.status_code == 200 and '"error"' not in r.text
                    results.append("ok" if ok else "error")
                except httpx.HTTPError:  # a cut body: an error the client sees
                    results.append("error")
                i += 1

    threads = [threading.Thread(target=client_loop, args=(w,)) for w in (1, 2)]
    for t in threads:
        t.start()
    started = time.time()
    with httpx.Client(base_url=endpoint, timeout=60) as client:
        body = {"messages": [{"role": "user", "content": "a long answer"}], "max_tokens": 1500, "stream": True,
                "ignore_eos": True}
        with client.stream("POST", "/v1/chat/completions", json=body) as stream:
            assert stream.status_code == 200
            victim = stream.headers["x-hf-paged-replica"]
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert '"error"' not in first
            kill_replica(victim)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and '"code": "replica_lost"' in rest[-2], rest[-3:]
        running = scrape(client)["hf_paged:num_requests_running"].samples
        left = {s.labels["replica"] for s in running}
        assert left and victim not in left, (victim, left)
        after = chat(client, SYSTEMS[0], "still there?")
        assert after.status_code == 200 and after.headers["x-hf-paged-replica"] != victim
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a request hung"
    assert results.count("error") <= 2, results  # at most what each client had in flight on the victim
    print(f"killed {victim}: {results.count('ok')} answers, {results.count('error')} errors, "
          f"{time.time() - started:.1f} s")

"""A mkdocs hook that writes the references which must not drift from the code.

``<!-- gen:metrics -->`` in a page becomes the table of every Prometheus family the
coordinator, a worker and a ps task export. It is not a list kept by hand: the hook starts a
real ps server and a real worker server in this process (the ``core.PsServer`` and
``core.WorkerServer`` that ``jaxcluster ps`` / ``jaxcluster worker`` run), a coordinator
pointed at that worker, serves each with the same ``jaxcluster.metrics.serve_*`` function the
CLI and ``metrics_port=`` use, scrapes the endpoints over HTTP and parses what they said.

``<!-- gen:env -->`` becomes the table of every ``JAXCLUSTER_*`` (and ``TF_COORDINATOR_*``)
variable the code reads, with each place that names it: the hook collects every string
literal that is exactly such a name from ``python/jaxcluster`` and ``rust/`` (Rust test
modules left out). Each needs a line in ``_ENV_MEANING`` below; a variable found in the code
without one, or a line for a variable the code no longer names, fails the build (under
``mkdocs build --strict`` and without it), so the page cannot fall behind the code.

The build needs jaxcluster importable with its extension and ``prometheus_client`` (the
``docs`` extra installs both). Run standalone (``python docs/gen_ref.py``) it prints both
tables.
"""

from __future__ import annotations

import re
import secrets
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: What each variable does, with its default. The names come from the code; this only
#: says what they mean (checked both ways against what the code names).
_ENV_MEANING: dict[str, str] = {
    "JAXCLUSTER_AUTH_TOKEN": "The cluster's bearer token, for coordinators, ps clients, "
    "`jaxcluster status` and tasks started without `--auth-token-file`.",
    "JAXCLUSTER_TLS_CA": "A CA (path or PEM text) clients verify TLS tasks against; workers "
    "read it to reach TLS ps tasks (a CA is never pickled).",
    "JAXCLUSTER_WORKER_RECOVERY_SEC": "Seconds a lost worker is retried before it is given up "
    "(default 3600, as TF).",
    "JAXCLUSTER_HEARTBEAT_TIMEOUT_SEC": "Seconds of silence from a worker running closures "
    "before it is declared failed (default 5; `none`: no bound).",
    "JAXCLUSTER_MAX_CLOSURE_RETRIES": "Deaths of its worker a closure survives before "
    "`WorkerCrashedError` (default 3; `none`: retry forever, as TF).",
    "JAXCLUSTER_CONNECT_TIMEOUT_SEC": "Seconds after start before `schedule`/`join`/`fetch` "
    "raise `UnavailableError` if no worker was ever reached (default 60).",
    "JAXCLUSTER_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES": "Alias of "
    "`TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES`; wins when both are set.",
    "TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES": "ps failure reports tolerated as transient "
    "before `PSUnavailableError` (default 3, as TF).",
    "JAXCLUSTER_COORDINATOR_SCHEDULE_START_DELAY": "Alias of "
    "`TF_COORDINATOR_SCHEDULE_START_DELAY`; wins when both are set.",
    "TF_COORDINATOR_SCHEDULE_START_DELAY": "Staggered start: worker `i` waits `i` times this "
    "many seconds before its first closure (TF's variable).",
    "JAXCLUSTER_COORDINATOR_SCHEDULE_START_DELAY_MAX": "Alias of "
    "`TF_COORDINATOR_SCHEDULE_START_DELAY_MAX`; wins when both are set.",
    "TF_COORDINATOR_SCHEDULE_START_DELAY_MAX": "The staggered start's upper bound in seconds "
    "(TF's variable).",
    "JAXCLUSTER_ENVIRONMENT": "Names the environment `resolve()` builds a resolver for "
    "(e.g. `slurm`) instead of detecting it.",
    "JAXCLUSTER_WORKERS": "`host:port,...`: the worker tasks, for detection's explicit "
    "environment (a `SimpleClusterResolver`).",
    "JAXCLUSTER_PS": "`host:port,...`: the ps tasks of that explicit environment.",
    "JAXCLUSTER_TASK_TYPE": "This process's task type in the explicit environment.",
    "JAXCLUSTER_TASK_ID": "This process's task index in the explicit environment.",
    "JAXCLUSTER_K8S_SELECTOR": "A pod opts in to Kubernetes detection with its worker job's "
    "label selector.",
    "JAXCLUSTER_K8S_JOBS": "Kubernetes detection: JSON mapping each job to its selectors.",
    "JAXCLUSTER_K8S_NAMESPACE": "Kubernetes detection: the namespace to search.",
    "JAXCLUSTER_K8S_PORT": "Kubernetes detection: the port tasks listen on.",
    "JAXCLUSTER_LOG_LEVEL": "Log level of `jaxcluster worker`/`ps` without `--log-level` "
    "(default INFO; `LocalCluster` sets WARNING).",
    "JAXCLUSTER_MALLOC_TUNING": "`0` turns off the glibc allocator tuning tasks and "
    "coordinators apply (freed message buffers stay mapped).",
    "JAXCLUSTER_SPIN_US": "Microseconds the thread in `fetch()`, a worker's executor and a "
    "runtime of one thread spin for an answer or the next closure before they park "
    "(adaptive, and each place keeps spinning only while its trials find it faster than "
    "parking; 0: never). Default 500 where the process may use at least 2 cores, else 0.",
    "JAXCLUSTER_RUNTIME_LEND": "`0` keeps a runtime of one thread to its own thread; by "
    "default (`1`), where spinning is on, the thread in `fetch()` or a worker's executor runs "
    "the runtime's tasks and I/O itself while it spins, and the runtime's thread stays out "
    "for up to 1 ms after.",
    "JAXCLUSTER_RUNTIME_THREADS": "Worker threads of the process's tokio runtime, 1 to 4. "
    "Default: one fewer than the cores the process may use (at least 1), leaving a core to "
    "the interpreter.",
    "JAXCLUSTER_PREVIOUS_EXIT": "Set by a supervisor (`LocalCluster`, `jaxcluster worker "
    "--slice-size`): how the task's previous process ended, reported in `WorkerCrashedError`.",
}

_NAME = re.compile(r"""["']((?:JAXCLUSTER|TF_COORDINATOR)_[A-Z0-9_]*[A-Z0-9])["']""")


def _sources() -> list[Path]:
    python = sorted((ROOT / "python" / "jaxcluster").rglob("*.py"))
    rust = [p for p in sorted((ROOT / "rust").rglob("*.rs")) if "tests" not in p.parts]
    return python + rust


def env_variables() -> dict[str, list[str]]:
    """Every variable name the code spells as a whole string literal -> ``path:line`` list."""
    found: dict[str, list[str]] = {}
    for path in _sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if path.suffix == ".rs" and line.strip().startswith("#[cfg(test)]"):
                break  # the rest of a Rust file is its unit tests
            if line.lstrip().startswith(("#", "//")):
                continue
            for match in _NAME.finditer(line):
                where = f"{path.relative_to(ROOT)}:{number}"
                found.setdefault(match.group(1), []).append(where)
    return found


def env_table() -> str:
    found = env_variables()
    missing = sorted(set(found) - set(_ENV_MEANING))
    stale = sorted(set(_ENV_MEANING) - set(found))
    if missing or stale:
        raise RuntimeError(
            f"docs/gen_ref.py: the environment-variable reference is out of date: "
            f"read by the code but not described: {missing}; described but no longer read: "
            f"{stale}. Edit _ENV_MEANING."
        )
    lines = ["| variable | what it does | where the code reads it |", "| --- | --- | --- |"]
    for name in sorted(found, key=lambda n: (n.startswith("TF_"), n)):
        places = "<br>".join(f"`{p}`" for p in found[name])
        lines.append(f"| `{name}` | {_ENV_MEANING[name]} | {places} |")
    return "\n".join(lines)


def _scrape(url: str) -> list[Any]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return list(text_string_to_metric_families(text))


def metric_families() -> dict[str, list[tuple[str, str, str, list[str]]]]:
    """Scrapes a real coordinator, worker and ps: endpoint -> (name, type, help, labels)."""
    from jaxcluster import ClusterSpec
    from jaxcluster._native import core
    from jaxcluster.cluster_resolver import SimpleClusterResolver
    from jaxcluster.coordinator import ClusterCoordinator
    from jaxcluster.metrics import serve_ps, serve_worker
    from jaxcluster.worker.devices import jax_runtime_info

    token = secrets.token_hex(16)
    scraped: dict[str, list[Any]] = {}
    ps = core.PsServer("127.0.0.1:0", auth_token=token, index=0)
    worker = core.WorkerServer(
        "127.0.0.1:0", auth_token=token, worker_index=0, **jax_runtime_info(0)
    )
    endpoints = [serve_ps(ps, "127.0.0.1", 0), serve_worker(worker, "127.0.0.1", 0)]
    try:
        scraped["ps"] = _scrape(endpoints[0].url)
        scraped["worker"] = _scrape(endpoints[1].url)
        resolver = SimpleClusterResolver(ClusterSpec({"worker": [worker.address]}))
        with ClusterCoordinator(resolver, auth_token=token, metrics_port=0) as coordinator:
            scraped["coordinator"] = _scrape(f"http://{coordinator.metrics_address}/metrics")
    finally:
        for endpoint in endpoints:
            endpoint.close()
        worker.shutdown()
        ps.shutdown()
    out: dict[str, list[tuple[str, str, str, list[str]]]] = {}
    for where, families in scraped.items():
        rows = []
        for family in families:
            if not family.name.startswith("jaxcluster_"):
                continue  # prometheus_client's process_* families
            labels = sorted(
                {k for s in family.samples for k in s.labels if k not in ("le", "quantile")}
            )
            name = family.name + ("_total" if family.type == "counter" else "")
            rows.append((name, family.type, family.documentation, labels))
        out[where] = rows
    return out


def metrics_table() -> str:
    parts = []
    for where, rows in metric_families().items():
        parts.append(f"### {where.capitalize()}\n")
        parts.append("| family | type | labels | meaning |\n| --- | --- | --- | --- |")
        for name, kind, text, labels in rows:
            label_text = ", ".join(f"`{label}`" for label in labels) or "-"
            parts.append(f"| `{name}` | {kind} | {label_text} | {text.replace('|', '/')} |")
        parts.append("")
    return "\n".join(parts)


_GENERATORS = {"<!-- gen:env -->": env_table, "<!-- gen:metrics -->": metrics_table}
_cache: dict[str, str] = {}


def on_page_markdown(markdown: str, **_: Any) -> str:
    """mkdocs hook: fills each ``<!-- gen:... -->`` marker with its generated table."""
    for marker, generate in _GENERATORS.items():
        if marker in markdown:
            if marker not in _cache:
                try:
                    _cache[marker] = generate()
                except Exception as exc:
                    from mkdocs.exceptions import PluginError

                    raise PluginError(f"{marker}: {exc}") from exc
            markdown = markdown.replace(marker, _cache[marker])
    return markdown


if __name__ == "__main__":
    print(env_table())
    print(metrics_table())

"""The Markdown summary table across benchmarks."""

from __future__ import annotations


def markdown_summary(all_metrics: dict[str, dict]) -> str:
    """One row per benchmark (n, problems, avg@n, pass@k, truncation, tokens, timeouts) and an
    unweighted average of avg@n."""
    ks = sorted({int(k) for m in all_metrics.values() for k in m.get("pass@k", {})})
    header = ["benchmark", "n", "problems", "avg@n"] + [f"pass@{k}" for k in ks] + [
        "truncated %", "mean tokens", "grader timeouts", "errors"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    accs = []
    for name, m in all_metrics.items():
        n = m.get("n_samples", 0)
        acc = m.get("accuracy")
        if acc is not None:
            accs.append(acc)
        passes = [f"{m['pass@k'][str(k)]:.1f}" if str(k) in m.get("pass@k", {}) else "" for k in ks]
        tokens = m.get("mean_response_tokens")
        row = [name, str(n), str(m.get("num_problems", 0)), f"{acc:.1f}" if acc is not None else ""] + passes + [
            f"{100 * m.get('truncation_ratio', 0):.1f}", f"{tokens:.0f}" if tokens is not None else "",
            str(m.get("grader_timeouts", 0)), str(m.get("generation_errors", 0))]
        lines.append("| " + " | ".join(row) + " |")
    if accs:
        avg = ["**average**", "", "", f"{sum(accs) / len(accs):.1f}"] + [""] * (len(header) - 4)
        lines.append("| " + " | ".join(avg) + " |")
    return "\n".join(lines)

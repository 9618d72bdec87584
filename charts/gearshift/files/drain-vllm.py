"""preStop of a vLLM policy pod: returns once vLLM has no request running or waiting, so the
SIGTERM that follows stops an idle server (a rolling publish drops no request). The kubelet ends
the hook when terminationGracePeriodSeconds runs out, whatever it is doing.

Arguments: PORT SETTLE_SECONDS [CA_FILE CERT_FILE KEY_FILE]. It first waits SETTLE_SECONDS: the
pod is leaving the Service's endpoints meanwhile, and requests still sent to it in that time are
waited for too. With the TLS files (tls.enabled) it asks over HTTPS, with the pod's certificate
(which a server under tls.clientAuth requires), the server's checked against the CA but not its
name (it is the loopback address). Runs in the vLLM image with python3 alone (no curl needed);
the metrics endpoint needs no API key.
"""

import ssl
import sys
import time
import urllib.request

QUEUES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def busy(metrics: str) -> float:
    """Requests running plus waiting, summed over every engine and model vLLM reports."""
    samples = (line.rsplit(None, 1) for line in metrics.splitlines() if line.strip() and not line.startswith("#"))
    return sum(float(value) for series, value in samples if series.partition("{")[0] in QUEUES)


def main(argv: list[str]) -> int:
    port, settle = int(argv[0]), float(argv[1])
    url, context = f"http://127.0.0.1:{port}/metrics", None
    if len(argv) > 2:
        ca, cert, key = argv[2:5]
        url, context = f"https://127.0.0.1:{port}/metrics", ssl.create_default_context(cafile=ca)
        context.check_hostname = False
        context.load_cert_chain(cert, key)
    time.sleep(settle)
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as reply:
                if busy(reply.read().decode()) == 0:
                    return 0
        except OSError:
            return 0  # no server to drain
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Probe of a server that requires client certificates (tls.clientAuth: the policy server, built-in
or vLLM), which the kubelet's httpGet, having none, cannot pass: GET URL over HTTPS with the pod's
certificate, the server's checked against the CA (its name is not: URL is the loopback address).
Exits 0 on a 2xx answer, 1 otherwise (the kubelet's timeoutSeconds bounds it).

Arguments: URL CA_FILE CERT_FILE KEY_FILE. Runs in the policy server's image with python alone.
"""

import ssl
import sys
import urllib.request


def main(argv: list[str]) -> int:
    url, ca, cert, key = argv
    context = ssl.create_default_context(cafile=ca)
    context.check_hostname = False
    context.load_cert_chain(cert, key)
    try:
        with urllib.request.urlopen(url, context=context, timeout=30) as reply:
            return 0 if 200 <= reply.status < 300 else 1
    except OSError as error:  # refused, TLS refused, 4xx and 5xx (HTTPError)
        print(f"{url}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

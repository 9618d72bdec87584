"""python -m gearshift.services.gateway: the gateway in the foreground."""
from gearshift.http_server import main
from gearshift.services.gateway.service import build

main(build)

"""python -m gearshift.services.store: the store service in the foreground."""
from gearshift.server import main
from gearshift.services.store.service import build

main(build)

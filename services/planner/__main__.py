from gearshift.cli import serve_service

serve_service("planner")

"""One-click deploys: build, run, health-check, route, roll back (built in issue 6)."""

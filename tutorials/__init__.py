"""Interactive tutorials: lesson format, courses, grader, progress (built in issue 7)."""

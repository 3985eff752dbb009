"""Reports of `exaplan whatif`: PNG plots (plots.py) and a self-contained HTML file (whatif.py).

Kept apart from the planner because it draws (matplotlib) and writes files; it reads the sweep's
result (planner.whatif.WhatifResult) and nothing else. Only cli/ imports it. Nothing is imported
here, so `import report` costs nothing until a plot is drawn.
"""

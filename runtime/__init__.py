"""exaplan runtime: executes plan files with torch.distributed (next milestone).

It imports only the plan schema (planner.schema.plan, planner.schema.specs) from the planner."""

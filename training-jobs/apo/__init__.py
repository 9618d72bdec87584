"""APO (A^2FM's Adaptive Policy Optimization): GRPO with adaptive forced + free sampling."""

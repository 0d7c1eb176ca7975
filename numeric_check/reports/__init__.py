"""Reports: a model's analysis and findings, rendered as Markdown, LaTeX and HTML with figures, and
the ``tcircuits demo`` walk-through.
"""

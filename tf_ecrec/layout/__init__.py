"""Where everything lives: the chunks and stripes of one table (`table_layout`), the job's placement of
every table (`placement`), rows as words and parity encoded in the graph (`stripe_encoding`), and the
device function that puts variables where the layout says (`device`). Layer 1.
"""

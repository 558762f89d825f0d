"""Ray itself: how every command starts or joins Ray (loopback and a token when it starts one), and job submission to
a cluster."""

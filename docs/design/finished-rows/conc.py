import threading, time, psycopg
DSN = "host=127.0.0.1 port=5499 user=postgres dbname=exp"
def setup(c, part):
    c.execute("DROP TABLE IF EXISTS cc CASCADE")
    if part:
        c.execute("CREATE TABLE cc (id int, status text, cancel_requested bool default false, PRIMARY KEY (id, status)) PARTITION BY LIST (status)")
        c.execute("CREATE TABLE cc_a PARTITION OF cc FOR VALUES IN ('READY','RUNNING')")
        c.execute("CREATE TABLE cc_f PARTITION OF cc FOR VALUES IN ('SUCCESSFUL')")
    else:
        c.execute("CREATE TABLE cc (id int primary key, status text, cancel_requested bool default false)")
    c.execute("INSERT INTO cc VALUES (1, 'RUNNING')")
for part in (False, True):
    a = psycopg.connect(DSN, autocommit=True); b = psycopg.connect(DSN, autocommit=True)
    setup(a, part)
    a.execute("BEGIN"); a.execute("UPDATE cc SET status='SUCCESSFUL' WHERE id=1 AND status='RUNNING'")
    out = {}
    def cancel():
        try:
            cur = b.execute("UPDATE cc SET cancel_requested = true WHERE id=1 AND status='RUNNING'")
            out['rows'] = cur.rowcount
        except Exception as e:
            out['error'] = f"{type(e).__name__}: {e}".strip()
    t = threading.Thread(target=cancel); t.start(); time.sleep(0.5)
    a.execute("COMMIT"); t.join()
    # a locking read with SKIP LOCKED / plain FOR UPDATE waiting
    a.execute("UPDATE cc SET status='RUNNING' WHERE id=1")
    a.execute("BEGIN"); a.execute("UPDATE cc SET status='SUCCESSFUL' WHERE id=1")
    def lock():
        try:
            cur = b.execute("SELECT id FROM cc WHERE id=1 FOR UPDATE")
            out['lock_rows'] = len(cur.fetchall())
        except Exception as e:
            out['lock_error'] = f"{type(e).__name__}: {e}".strip()
    t = threading.Thread(target=lock); t.start(); time.sleep(0.5)
    a.execute("COMMIT"); t.join()
    print("partitioned" if part else "plain", out)

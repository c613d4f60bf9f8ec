"""bench/remote's boto3 baseline: upload or download every file of a tree
with boto3's upload_file / download_file (its managed transfer: multipart
above 8 MiB), THREADS files at a time.

    remote-boto3.py up|down DIR BUCKET PREFIX THREADS

Keys and endpoint come from the AWS environment variables, as boto3 reads
them."""
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import boto3

mode, root, bucket, prefix, threads = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])


def up(rel):
    s3.upload_file(os.path.join(root, rel), bucket, f"{prefix}/{rel}")


def down(key):
    rel = key[len(prefix) + 1:]
    dst = os.path.join(root, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    s3.download_file(bucket, key, dst)


with ThreadPoolExecutor(int(threads)) as pool:
    if mode == "up":
        rels = []
        for d, _, files in os.walk(root):
            for f in files:
                p = os.path.join(d, f)
                if os.path.isfile(p) and not os.path.islink(p):
                    rels.append(os.path.relpath(p, root))
        list(pool.map(up, rels))
    else:
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            keys += [o["Key"] for o in page.get("Contents", [])]
        list(pool.map(down, keys))

// Command etcd runs the etcd server; a wrapper so etcd builds from its published modules.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}

// kcached seen by clients kcache did not write: grpc-js-reflection-client
// (npm) lists the services through server reflection (v1alpha, what gRPC
// 1.51's C++ server speaks), fetches kcache.v1.AdminService's descriptor and
// calls Stats through a stub built from that descriptor alone; the official
// grpc-health-check package's client calls grpc.health.v1.Health/Check.
//
// usage: node reflection_check.js unix:///abs/path/kcached.sock
// Exits 0 when every check passes; otherwise prints what failed and exits 1.
'use strict';

const grpc = require('@grpc/grpc-js');
const { GrpcReflection } = require('grpc-js-reflection-client');
const health = require('grpc-health-check');

const target = process.argv[2];
if (!target) {
  console.error('usage: node reflection_check.js unix:///abs/path.sock');
  process.exit(2);
}
const deadline = () => new Date(Date.now() + 20000);

function check(cond, what) {
  if (!cond) throw new Error(what);
  console.log(`ok: ${what}`);
}

async function main() {
  // The library's default protocol is v1alpha; name it, since it matters.
  const reflection = new GrpcReflection(target, grpc.credentials.createInsecure(), {}, 'v1alpha');

  const services = await reflection.listServices('*', { deadline: deadline() });
  console.log(`services: ${services.join(', ')}`);
  for (const s of ['kcache.v1.KernelService', 'kcache.v1.AdminService', 'grpc.health.v1.Health']) {
    check(services.includes(s), `reflection lists ${s}`);
  }

  const methods = (await reflection.listMethods('kcache.v1.KernelService', { deadline: deadline() }))
    .map((m) => m.name);
  check(['GetKernel', 'GetKernelStream', 'Prefetch'].every((m) => methods.includes(m)),
    `KernelService descriptor has GetKernel, GetKernelStream, Prefetch (got ${methods.join(', ')})`);

  // A stub from the reflected descriptor only (no .proto file here).
  const descriptor = await reflection.getDescriptorBySymbol('kcache.v1.AdminService',
    { deadline: deadline() });
  const pkg = descriptor.getPackageObject({ keepCase: true, longs: String, enums: String, defaults: true });
  const Admin = pkg.kcache.v1.AdminService;
  check(typeof Admin === 'function', 'AdminService descriptor builds a client');
  const admin = new Admin(target, grpc.credentials.createInsecure());
  const stats = await new Promise((resolve, reject) => {
    admin.Stats({}, { deadline: deadline() }, (err, resp) => (err ? reject(err) : resolve(resp)));
  });
  check(stats.compile_only === true, `AdminService/Stats via the reflected descriptor: compile_only=${stats.compile_only}, entries=${stats.entries}`);
  admin.close();

  const Health = grpc.makeClientConstructor(health.service, 'grpc.health.v1.Health');
  const hc = new Health(target, grpc.credentials.createInsecure());
  const status = await new Promise((resolve, reject) => {
    hc.Check({ service: '' }, { deadline: deadline() }, (err, resp) => (err ? reject(err) : resolve(resp)));
  });
  check(status.status === 'SERVING' || status.status === 1,
    `grpc.health.v1.Health/Check answers ${status.status}`);
  hc.close();
}

main().then(() => process.exit(0), (err) => {
  console.error(`FAILED: ${err && err.stack ? err.stack : err}`);
  process.exit(1);
});
